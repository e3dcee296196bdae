"""The segment files of an lmc archive (ARCHIVE.md): one step's sections, its index and a footer, written
under a temporary name and committed whole (lmc.storage), read back checked against the manifest's entry."""
import os
import secrets
import struct
import threading

from ._manifest import SEG_RE, ArchiveError, canon, crc32, load_json, store

SEG_MAGIC = b"LMCASEG\x01"
FOOT_MAGIC = b"LMCAIDX\x01"
FOOTER = struct.Struct("<8sQQII")  # magic, index offset, index length, index crc, footer crc
MAX_STEP = 10 ** 12   # steps are 0 <= step < MAX_STEP: a segment's name carries the step in 12 digits
MAX_INDEX = 1 << 30


def check_step_number(step):
    """step as an int, or ArchiveError (one line) when a segment name cannot carry it."""
    try:
        step = int(step)
    except (TypeError, ValueError):
        raise ArchiveError(f"step {step!r} is not an integer") from None
    if not 0 <= step < MAX_STEP:
        raise ArchiveError(f"step {step} is out of range (steps are 0 to {MAX_STEP - 1:,}; "
                           "segment names carry 12 digits)")
    return step


class SegmentWriter:
    """Writes one step's segment: sections, then the index and a footer.
    Data goes to a temporary file; commit() fsyncs and renames it. ``crc``: sections carry a CRC-32 (the
    version 1-2 form, for a step whose index stays version 2 when it is re-coded); version 3 sections are
    [offset, length], their bytes covered by the pieces' xxh3-128 (_integrity)."""

    def __init__(self, root, step, crc=False):
        self.root = root
        self.crc = crc
        self.name = f"seg-{int(step):012d}-{secrets.token_hex(4)}.lmca"
        self.f = store(root).open_write(self.name)
        self.f.write(SEG_MAGIC)
        self.pos = len(SEG_MAGIC)
        self.size = None
        self.index_crc = None

    def add_section(self, data):
        """Append bytes; returns the section reference [offset, length] (with ``crc``: [offset, length, crc32])."""
        mv = memoryview(data).cast("B")
        n = mv.nbytes
        self.f.write(mv)
        ref = [self.pos, n, crc32(mv)] if self.crc else [self.pos, n]
        self.pos += n
        return ref

    def commit(self, index):
        idx = canon(index)
        off = self.pos
        self.f.write(idx)
        head = FOOTER.pack(FOOT_MAGIC, off, len(idx), crc32(idx), 0)[:-4]
        self.f.write(head + struct.pack("<I", crc32(head)))
        self.size = off + len(idx) + FOOTER.size
        self.f.commit()
        self.index_crc = crc32(idx)
        return self.name

    def abort(self):
        self.f.abort()


def probe_segment(root, name):
    """The manifest fields a segment file says of itself (step, segment, size, index_crc), from
    its name and footer, for rebuilding a lost manifest; ArchiveError if it cannot say."""
    m = SEG_RE.match(name)
    if not m:
        raise ArchiveError(f"{name}: not a segment name")
    b = store(root)
    size = b.size(name)
    if size < len(SEG_MAGIC) + FOOTER.size:
        raise ArchiveError(f"{name}: too short")
    with b.open_read(name) as f:
        f.seek(size - FOOTER.size)
        foot = f.read(FOOTER.size)
    magic, _off, _n, icrc, fcrc = FOOTER.unpack(foot)
    if magic != FOOT_MAGIC or crc32(foot[:-4]) != fcrc:
        raise ArchiveError(f"{name}: damaged segment footer")
    return {"step": int(m.group(1)), "segment": name, "size": size, "index_crc": icrc}


class SegmentReader:
    """Reads a committed segment, checking it against its manifest entry."""

    def __init__(self, root, entry):
        self.step = entry["step"]
        self._lock = threading.Lock()
        b = store(root)
        self.path = b.where(entry["segment"])
        try:
            self.f = b.open_read(entry["segment"])
            self.fsize = b.size(entry["segment"])
        except OSError as e:
            raise ArchiveError(f"step {self.step}: cannot open segment "
                               f"{entry['segment']}: {e.strerror or e}") from None
        try:
            self._open(entry)
        except BaseException:
            self.f.close()
            raise

    def _open(self, entry):
        size = self.fsize
        if size != entry["size"]:
            raise ArchiveError(f"step {self.step}: segment has {size} bytes, "
                               f"{entry['size']} recorded (truncated or damaged)")
        if size < len(SEG_MAGIC) + FOOTER.size:
            raise ArchiveError(f"step {self.step}: segment too short")
        if self._read(0, len(SEG_MAGIC)) != SEG_MAGIC:
            raise ArchiveError(f"step {self.step}: bad segment magic")
        foot = self._read(size - FOOTER.size, FOOTER.size)
        magic, off, n, icrc, fcrc = FOOTER.unpack(foot)
        if magic != FOOT_MAGIC or crc32(foot[:-4]) != fcrc:
            raise ArchiveError(f"step {self.step}: damaged segment footer")
        if not (len(SEG_MAGIC) <= off and off + n == size - FOOTER.size and n <= MAX_INDEX):
            raise ArchiveError(f"step {self.step}: bad index location")
        if icrc != entry["index_crc"]:
            raise ArchiveError(f"step {self.step}: index checksum differs from the manifest")
        data = self._read(off, n)
        if crc32(data) != icrc:
            raise ArchiveError(f"step {self.step}: index checksum mismatch")
        self.data_end = off
        self.index = load_json(data, f"step {self.step} index")

    def _read(self, off, n):
        """Bytes [off, off + n): pread on a local file (threads read at once), else seek and read under a lock."""
        try:
            fd = self.f.fileno()
        except (AttributeError, OSError, ValueError):
            fd = None
        if fd is not None:
            data = os.pread(fd, n, off)
            while len(data) < n:
                more = os.pread(fd, n - len(data), off + len(data))
                if not more:
                    break
                data += more
        else:
            with self._lock:
                self.f.seek(off)
                data = self.f.read(n)
        if len(data) != n:
            raise ArchiveError(f"step {self.step}: short read (truncated segment)")
        return data

    def read(self, sec, what="section", into=None):
        """Bytes of a section reference, checksum-checked (versions 1-2). ``into``: a callable giving a uint8
        buffer of n bytes to read a local segment's section into (a thread's scratch), returned instead."""
        off, n = sec[0], sec[1]
        if not (len(SEG_MAGIC) <= off and off + n <= self.data_end):
            raise ArchiveError(f"step {self.step}: {what}: section out of bounds")
        data = self._read_into(off, n, into) if into is not None else self._read(off, n)
        if len(sec) == 3 and crc32(data) != sec[2]:
            raise ArchiveError(f"step {self.step}: {what}: checksum mismatch (damaged data)")
        return data

    def _read_into(self, off, n, into):
        try:
            fd = self.f.fileno()
        except (AttributeError, OSError, ValueError):
            return self._read(off, n)
        buf = into(n)
        mv, got = memoryview(buf), 0
        while got < n:
            k = os.preadv(fd, [mv[got:]], off + got)
            if k <= 0:
                raise ArchiveError(f"step {self.step}: short read (truncated segment)")
            got += k
        return buf

    def close(self):
        self.f.close()

