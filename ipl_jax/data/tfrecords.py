"""TFRecord files read and written without TensorFlow (framing: uint64 length, masked CRC32C of it, data, masked
CRC32C of the data); both checksums are verified on reading. CRC and ``tf.train.Example`` come from ``tfrecord``."""

from __future__ import annotations

import gzip
import struct
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path

from tfrecord.writer import TFRecordWriter

from ipl_jax.data.records import DataError


def masked_crc(data: bytes) -> bytes:
    """TFRecord's masked CRC32C of ``data`` as 4 little-endian bytes."""
    return TFRecordWriter.masked_crc(bytes(data))


def example_bytes(features: dict) -> bytes:
    """A serialized ``tf.train.Example`` of ``{key: (values, "int" | "byte" | "float")}``."""
    return TFRecordWriter.serialize_tf_example(features)


def write_tfrecords(path: str | Path, payloads: Iterable[bytes], compression: str | None = "gzip") -> int:
    """Write ``payloads`` as one TFRecord file (GZIP by default); returns the record count. The file appears whole
    or not at all (written as a hidden file, then renamed)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    opener = gzip.open if compression == "gzip" else open
    n = 0
    with opener(tmp, "wb") as f:
        for payload in payloads:
            length = struct.pack("<Q", len(payload))
            f.write(length + masked_crc(length) + payload + masked_crc(payload))
            n += 1
    tmp.replace(path)
    return n


def iter_tfrecords(
    path: str | Path, compression: str | None = "gzip"
) -> Iterator[tuple[int, bytes | None, DataError | None]]:
    """Yield ``(index, payload, None)`` per record, both checksums verified; a bad data checksum yields ``(index,
    None, DataError)``, any other framing error raises ``DataError``.
    """
    path = Path(path)
    opener = gzip.open if compression == "gzip" else open
    index = 0
    try:
        with opener(path, "rb") as f:
            while True:
                head = f.read(12)
                if not head:
                    return
                if len(head) != 12:
                    raise DataError(path, index, "<framing>", "truncated record header")
                length_bytes, length_crc = head[:8], head[8:]
                if masked_crc(length_bytes) != length_crc:
                    raise DataError(path, index, "<framing>", "length crc mismatch (rest of file unreadable)")
                (length,) = struct.unpack("<Q", length_bytes)
                payload = f.read(length)
                data_crc = f.read(4)
                if len(payload) != length or len(data_crc) != 4:
                    raise DataError(path, index, "<framing>", "truncated record")
                if masked_crc(payload) != data_crc:
                    yield index, None, DataError(path, index, "<framing>", "data crc mismatch")
                else:
                    yield index, payload, None
                index += 1
    except (OSError, EOFError, zlib.error) as e:  # gzip.BadGzipFile is an OSError
        raise DataError(path, index, "<framing>", f"unreadable {compression or 'raw'} stream: {e}") from None
