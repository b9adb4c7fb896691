"""Binary wire formats of internal records: frames of numpy columns, group-key columns, and
chunking of payloads larger than one Kafka record (pure logic, no I/O)."""

from stream_dp.wire.chunks import Assembled, Chunk, ChunkAssembler, Dropped, chunk_records, decode_chunk
from stream_dp.wire.frame import (
    BINARY_VERSION,
    Frame,
    UnknownWireVersion,
    WireFormatError,
    decode_frame,
    encode_frame,
    is_binary,
    read_prefix,
)

__all__ = [
    "BINARY_VERSION",
    "Assembled",
    "Chunk",
    "ChunkAssembler",
    "Dropped",
    "Frame",
    "UnknownWireVersion",
    "WireFormatError",
    "chunk_records",
    "decode_chunk",
    "decode_frame",
    "encode_frame",
    "is_binary",
    "read_prefix",
]
