"""The archive's one integrity layer (ARCHIVE.md, "Integrity").

Version 3 checks every stored byte once, end to end, with xxh3-128 (non-cryptographic, about 10 GB/s a core):
each piece of a step - a tensor, a 4 MiB chunk of verbatim bytes - carries the hash of its *original* bytes,
computed at add time on the buffer that is then coded (in cache, in the worker that codes it) and checked
after the piece is decoded, by restore and verify. So one check covers the storage, the zlib/lmc decoding,
and the reference a tensor was decoded against. Versions 1 and 2 (read, never written) carried three layers:
CRC-32 of each section, SHA-256 of each tensor (first 128 bits) and SHA-256 of each whole file."""
import hashlib

import xxhash

XXH_HEX = 32  # hex digits of an xxh3-128 digest


def xxh(data):
    """xxh3-128 of a bytes-like object or a contiguous array, as 32 hex digits."""
    return xxhash.xxh3_128_hexdigest(data)


def sha128(data):
    """First 128 bits of SHA-256, the tensor checksum of versions 1 and 2."""
    return hashlib.sha256(data).hexdigest()[:32]


def digest_key(entry):
    """The checksum field an index entry carries: "xxh" (version 3) or "sha" (versions 1-2, tensors only);
    None for a version 1-2 chunk (its section CRC and the file's SHA-256 cover it)."""
    if "xxh" in entry:
        return "xxh"
    return "sha" if "sha" in entry else None


def matches(entry, data):
    """True when data (uint8, contiguous) hashes to the entry's recorded checksum (False without one)."""
    k = digest_key(entry)
    if k is None:
        return False
    return (xxh(data) if k == "xxh" else sha128(data)) == entry[k]


def same_digest(a, b):
    """Whether two entries record the same checksum of their bytes (both must use the same hash)."""
    k = digest_key(a)
    return k is not None and k == digest_key(b) and a[k] == b[k]
