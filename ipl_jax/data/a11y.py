"""Android accessibility trees (android_env's ``AndroidAccessibilityForest`` protos) as UI elements, the element a
click lands on, and elements written back as a forest (``forest_bytes``), via a partial copy of the schema."""

from __future__ import annotations

import functools
from collections.abc import Sequence

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from ipl_jax.data.aitz import box_area, box_contains, pixel_box_to_fractions
from ipl_jax.data.records import UIElement


@functools.cache  # one class per process: building a descriptor pool per tree would be wasteful
def _a11y_forest_class():
    """A message class for android_env's ``AndroidAccessibilityForest`` with only the fields read here."""
    F = descriptor_pb2.FieldDescriptorProto
    fd = descriptor_pb2.FileDescriptorProto(name="ipl_jax_a11y.proto", package="ipl_jax_a11y", syntax="proto3")

    def message(name, fields):
        m = fd.message_type.add(name=name)
        for fname, number, ftype, label, type_name in fields:
            f = m.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                f.type_name = ".ipl_jax_a11y." + type_name

    opt, rep = F.LABEL_OPTIONAL, F.LABEL_REPEATED
    message("Rect", [(n, i, F.TYPE_INT32, opt, None) for i, n in enumerate(("left", "top", "right", "bottom"), 1)])
    message(
        "Node",
        [
            ("bounds_in_screen", 2, F.TYPE_MESSAGE, opt, "Rect"),
            ("class_name", 3, F.TYPE_STRING, opt, None),
            ("content_description", 4, F.TYPE_STRING, opt, None),
            ("text", 7, F.TYPE_STRING, opt, None),
            ("view_id_resource_name", 10, F.TYPE_STRING, opt, None),
            ("is_clickable", 14, F.TYPE_BOOL, opt, None),
            ("is_long_clickable", 19, F.TYPE_BOOL, opt, None),
            ("is_scrollable", 21, F.TYPE_BOOL, opt, None),
        ],
    )
    message("Tree", [("nodes", 1, F.TYPE_MESSAGE, rep, "Node")])
    message("Window", [("tree", 11, F.TYPE_MESSAGE, opt, "Tree")])
    message("Forest", [("windows", 1, F.TYPE_MESSAGE, rep, "Window")])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("ipl_jax_a11y.Forest"))


def a11y_elements(forest_bytes: bytes, width: int, height: int) -> tuple[UIElement, ...]:
    """The nodes of a serialized accessibility forest with a non-empty box, boxes in screen fractions.

    ``kind``: the class name; ``text``: text, else content description. Raises ``DecodeError`` on bad bytes.
    """
    forest = _a11y_forest_class().FromString(forest_bytes)
    out = []
    for window in forest.windows:
        for node in window.tree.nodes:
            r = node.bounds_in_screen
            if r.right <= r.left or r.bottom <= r.top:
                continue
            out.append(
                UIElement(
                    box=pixel_box_to_fractions(r.left, r.top, r.right, r.bottom, width, height),
                    text=(node.text or node.content_description).strip(),
                    kind=node.class_name,
                    clickable=node.is_clickable or node.is_long_clickable,
                )
            )
    return tuple(out)


def forest_bytes(nodes: Sequence[tuple]) -> bytes:
    """A serialized one-window forest of ``nodes`` = [((left, top, right, bottom) pixels, text, class_name,
    clickable)], in android_env's field numbers: what ``a11y_elements`` reads back."""
    forest = _a11y_forest_class()()
    tree = forest.windows.add().tree
    for (left, top, right, bottom), text, class_name, clickable in nodes:
        node = tree.nodes.add(text=text, class_name=class_name, is_clickable=bool(clickable))
        r = node.bounds_in_screen
        r.left, r.top, r.right, r.bottom = (int(v) for v in (left, top, right, bottom))
    return forest.SerializeToString()


def elements_forest(elements: Sequence[UIElement], width: int, height: int) -> bytes:
    """``forest_bytes`` of UI elements (boxes in screen fractions) on a ``width`` x ``height`` screenshot; the
    element's ``kind`` becomes the node's class name."""
    return forest_bytes(
        [
            (
                (round(x1 * width), round(y1 * height), round(x2 * width), round(y2 * height)),
                el.text,
                el.kind,
                el.clickable,
            )
            for el in elements
            for x1, y1, x2, y2 in [el.box]
        ]
    )


def click_target(elements: Sequence[UIElement], point) -> tuple[tuple | None, str | None]:
    """(box, text) of the smallest clickable element containing ``point`` (any element if none is clickable); a
    textless target takes the text of its smallest text-bearing child containing the point.
    """
    containing = [e for e in elements if box_contains(e.box, point)]
    if not containing:
        return None, None
    pool = [e for e in containing if e.clickable] or containing
    best = min(pool, key=lambda e: box_area(e.box))
    text = best.text
    if not text:
        inner = [
            e
            for e in containing
            if e.text
            and e.box[0] >= best.box[0]
            and e.box[1] >= best.box[1]
            and e.box[2] <= best.box[2]
            and e.box[3] <= best.box[3]
        ]
        if inner:
            text = min(inner, key=lambda e: box_area(e.box)).text
    return best.box, (text or None)
