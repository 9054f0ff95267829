"""Helpers shared by the test modules (no tests here: pytest collects nothing from this package). Fixtures live
in ``tests/conftest.py``; plain functions with arguments live here, where subprocess scripts can import them too.

The tiny test models share one small vocabulary layout: the special ids below, text ids from FIRST_TEXT_ID.
"""

EOS, VISION_START, VISION_END, IMAGE, VIDEO = 2, 3, 4, 5, 6
FIRST_TEXT_ID = 10
