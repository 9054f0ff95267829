"""The fixed vocabularies of the synthetic world: apps, settings, contacts, products, store apps, messages.

Everything here is constant data; all per-episode randomness (orders, subsets, states) is drawn in the apps'
``reset`` from the world's seeded generator.
"""

from __future__ import annotations

# The four apps tasks are built on. Every home screen holds them plus a random set of distractor apps.
CORE_APPS = ("Settings", "Shop", "Store", "Messages")

# name -> (icon colour, glyph). Each icon is a coloured tile with its glyph; no two apps share both.
APP_ICONS = {
    "Settings": ((96, 104, 120), "gear"),
    "Shop": ((236, 120, 30), "bag"),
    "Store": ((30, 150, 90), "tri"),
    "Messages": ((40, 120, 230), "bubble"),
    "Camera": ((60, 60, 60), "dot"),
    "Clock": ((20, 20, 90), "clock"),
    "Maps": ((40, 170, 160), "pin"),
    "Music": ((220, 40, 90), "note"),
    "Photos": ((250, 190, 30), "M"),
    "Weather": ((90, 170, 240), "sun"),
    "Notes": ((240, 210, 90), "N"),
    "Mail": ((200, 50, 50), "env"),
    "Calendar": ((60, 90, 200), "31"),
    "Files": ((110, 80, 190), "F"),
    "Phone": ((50, 180, 70), "P"),
    "News": ((150, 30, 40), "Nw"),
    "Radio": ((170, 100, 40), "R"),
    "Wallet": ((20, 100, 60), "W"),
    "Health": ((230, 80, 140), "+"),
    "Books": ((160, 110, 60), "B"),
    "Podcasts": ((130, 40, 180), "mic"),
    "Games": ((40, 40, 160), "G"),
    "Fitness": ((250, 90, 60), "run"),
    "Translate": ((60, 130, 250), "A"),
    "Recorder": ((200, 30, 30), "rec"),
    "Contacts": ((30, 130, 130), "C"),
}
EXTRA_APPS = tuple(a for a in APP_ICONS if a not in CORE_APPS)

# What a distractor app shows when opened (its feature rows; tapping one only shows a short note).
APP_FEATURES = {
    "Camera": ("Photo", "Video", "Portrait", "Timer"),
    "Clock": ("Alarm 07:00", "Timer", "Stopwatch", "World clock"),
    "Maps": ("Home", "Work", "Saved places", "Explore"),
    "Music": ("Playlists", "Albums", "Artists", "Radio mix"),
    "Photos": ("Albums", "Favourites", "Videos", "Trash"),
    "Weather": ("Today 21°", "Tomorrow 18°", "Rain radar", "Cities"),
    "Notes": ("Shopping list", "Ideas", "Recipes", "New note"),
    "Mail": ("Inbox", "Sent", "Drafts", "Spam"),
    "Calendar": ("Today", "Week", "Month", "New event"),
    "Files": ("Downloads", "Images", "Documents", "Audio"),
    "Phone": ("Recents", "Favourites", "Keypad", "Voicemail"),
    "News": ("Top stories", "Sports", "Science", "Local"),
    "Radio": ("FM 98.1", "FM 101.5", "Favourites", "Scan"),
    "Wallet": ("Cards", "Passes", "Transfers", "History"),
    "Health": ("Steps 4,210", "Sleep", "Heart rate", "Water"),
    "Books": ("Reading now", "Library", "Wishlist", "Audiobooks"),
    "Podcasts": ("Up next", "Library", "Episodes", "Search"),
    "Games": ("Play now", "Friends", "Scores", "Arcade"),
    "Fitness": ("Start run", "Workouts", "Progress", "Goals"),
    "Translate": ("Text", "Camera", "Voice", "Phrasebook"),
    "Recorder": ("Record", "Recordings", "Share", "Trash"),
    "Contacts": ("Favourites", "All contacts", "Groups", "Add contact"),
}

# Settings. Toggles on the main list, submenus with their own toggles, and plain information rows.
MAIN_TOGGLES = (
    "Wi-Fi",
    "Bluetooth",
    "Airplane mode",
    "Mobile data",
    "Hotspot",
    "NFC",
    "Location",
    "Battery saver",
    "Auto-rotate",
    "Do not disturb",
)
SUBMENUS = {
    "Display": ("Dark theme", "Auto brightness", "Night light", "Large text"),
    "Sound": ("Vibrate on ring", "Dial pad tones", "Silent mode", "Touch sounds"),
    "Privacy": ("Camera access", "Mic access", "Show passwords", "Ad tracking"),
    "Notifications": ("Lock screen alerts", "Badges", "Flash alerts", "Bubbles"),
}
INFO_ROWS = {
    "Storage": ("Used 23 GB of 64 GB", "Apps 9 GB", "Photos 11 GB"),
    "About phone": ("Model P-7", "Android 14", "Build 2024.1"),
    "Apps": ("48 apps installed", "Default apps", "App permissions"),
    "Accounts": ("Personal account", "Work account", "Sync on"),
    "Security": ("Screen lock PIN", "Face unlock", "Find my device"),
    "Date & time": ("Automatic time", "Time zone UTC+1", "24-hour format"),
}
SUB_TOGGLES = tuple(t for ts in SUBMENUS.values() for t in ts)
SUBMENU_OF = {t: m for m, ts in SUBMENUS.items() for t in ts}

CONTACTS = (
    "Anna",
    "Ben",
    "Carla",
    "David",
    "Emma",
    "Felix",
    "Grace",
    "Hugo",
    "Iris",
    "Jack",
    "Kim",
    "Leo",
    "Maya",
    "Nina",
    "Omar",
    "Paul",
    "Rosa",
    "Sam",
    "Tara",
    "Victor",
)
MESSAGE_TEXTS = (
    "hi",
    "on my way",
    "see you soon",
    "thanks!",
    "running late",
    "call me",
    "good night",
    "lunch at noon?",
    "happy birthday",
    "ok",
    "where are you?",
    "I'm home",
)
PREVIEWS = ("See you!", "ok", "Thanks", "Sure, why not", "Haha", "Sent a photo", "Talk later", "Yes", "No worries")

COLOURS = ("Red", "Blue", "Black", "White", "Green")
ITEMS = ("Shoes", "Hat", "Jacket", "Bag", "Watch", "Lamp", "Mug", "Socks")
PRODUCT_MODELS = ("Classic", "Sport", "Lite", "Pro", "Max", "Mini", "Air", "Plus")
SHOP_CHIPS = ("Deals", "New", "Top rated", "Gifts", "Outlet")

STORE_APPS = (
    "Notely",
    "FitTrack",
    "PhotoBox",
    "TaskFlow",
    "Budgetly",
    "SkyCast",
    "ChefBook",
    "StepUp",
    "Lingo",
    "PodNest",
    "ZenTime",
    "Tripster",
    "CodePad",
    "PetPal",
)
STORE_DEVELOPERS = ("Acme Labs", "Blue Fox", "Nimbus", "Orbit Apps", "Pixel Co")
STORE_CHIPS = ("Top charts", "Games", "Kids", "Editors' picks")
