"""WAV (RIFF/WAVE) decoding in pure Python, numpy used when present for speed.

Handles PCM 8-bit unsigned, 16/24/32-bit signed, IEEE float 32/64,
WAVE_FORMAT_EXTENSIBLE, chunks in any order and odd-sized (padded) chunks.
Samples come back as floats in [-1, 1) mixed down to mono.
"""
import struct
import sys
from array import array

from ..errors import FormatError

PCM, IEEE_FLOAT, EXTENSIBLE = 0x0001, 0x0003, 0xFFFE
# Sample rates a real recording can have (telephone 8 kHz down to 1 kHz for sensor
# data, up to 768 kHz studio converters). Anything else is a corrupt header, and
# resampling from it would be pointless work.
MIN_SAMPLE_RATE, MAX_SAMPLE_RATE = 1000, 768000
MAX_BLOCK_BYTES = 4 << 20  # read_blocks reads at most this much of the file at a time
# The 14 bytes after the format code in an extensible SubFormat GUID.
_GUID_TAIL = b"\x00\x00\x00\x00\x10\x00\x80\x00\x00\xaa\x00\x38\x9b\x71"
_FORMAT_NAMES = {0x0002: "MS ADPCM", 0x0006: "A-law", 0x0007: "mu-law", 0x0011: "IMA ADPCM", 0x0055: "MP3"}


class WavInfo:
    """What the fmt chunk says: format code (PCM or IEEE_FLOAT after unwrapping
    EXTENSIBLE), channels, sample rate and bits per sample (container size)."""

    __slots__ = ("format", "channels", "sample_rate", "bits")

    def __init__(self, fmt, channels, sample_rate, bits):
        self.format, self.channels, self.sample_rate, self.bits = fmt, channels, sample_rate, bits

    def __repr__(self):
        kind = "float" if self.format == IEEE_FLOAT else "pcm"
        return f"WavInfo({kind}{self.bits}, {self.channels} ch, {self.sample_rate} Hz)"


def is_wav(data):
    return len(data) >= 12 and bytes(data[0:4]) == b"RIFF" and bytes(data[8:12]) == b"WAVE"


def read_chunks(data, name):
    """(fmt chunk bytes, data chunk bytes) of a RIFF/WAVE file, in whatever order they come."""
    if not is_wav(data):
        raise FormatError(f"{name}: not a RIFF/WAVE file (starts with {bytes(data[:12])!r})")
    view = memoryview(data)
    pos, fmt, samples = 12, None, None
    while pos + 8 <= len(view):
        chunk_id = bytes(view[pos:pos + 4])
        (size,) = struct.unpack_from("<I", view, pos + 4)
        body = view[pos + 8:pos + 8 + size]
        if chunk_id == b"fmt ":
            fmt = bytes(body)
        elif chunk_id == b"data":
            if len(body) < size:
                raise FormatError(f"{name}: truncated data chunk: header says {size} bytes, file has {len(body)}")
            samples = body
        pos += 8 + size + (size & 1)  # chunks are padded to an even size
    if fmt is None:
        raise FormatError(f"{name}: WAV file has no 'fmt ' chunk")
    if samples is None:
        raise FormatError(f"{name}: WAV file has no 'data' chunk")
    return fmt, samples


def parse_fmt(fmt, name):
    if len(fmt) < 16:
        raise FormatError(f"{name}: 'fmt ' chunk is {len(fmt)} bytes, needs at least 16")
    code, channels, rate, _byte_rate, block_align, bits = struct.unpack_from("<HHIIHH", fmt)
    if code == EXTENSIBLE:
        if len(fmt) < 40:
            raise FormatError(f"{name}: WAVE_FORMAT_EXTENSIBLE 'fmt ' chunk is {len(fmt)} bytes, needs 40")
        code = struct.unpack_from("<H", fmt, 24)[0]
        if fmt[26:40] != _GUID_TAIL:
            raise FormatError(f"{name}: WAVE_FORMAT_EXTENSIBLE with an unknown SubFormat GUID {fmt[24:40].hex()}")
    if code not in (PCM, IEEE_FLOAT):
        what = _FORMAT_NAMES.get(code, "unknown")
        raise FormatError(f"{name}: unsupported WAV format code 0x{code:04x} ({what}); "
                          "only PCM and IEEE float are decoded: convert to PCM WAV")
    supported = (8, 16, 24, 32) if code == PCM else (32, 64)
    if bits not in supported:
        kind = "PCM" if code == PCM else "float"
        raise FormatError(f"{name}: unsupported bit depth {bits} for {kind} WAV (supported: {supported})")
    if channels < 1:
        raise FormatError(f"{name}: WAV header has {channels} channels")
    if not MIN_SAMPLE_RATE <= rate <= MAX_SAMPLE_RATE:
        raise FormatError(f"{name}: WAV header says {rate} Hz; the accepted sample rates are "
                          f"{MIN_SAMPLE_RATE}-{MAX_SAMPLE_RATE} Hz: the header is corrupt, or convert the audio "
                          "(e.g. `ffmpeg -i IN -ar 16000 OUT.wav`)")
    if block_align != channels * bits // 8:
        raise FormatError(f"{name}: WAV block align {block_align} does not match {channels} channels x {bits} bits")
    return WavInfo(code, channels, rate, bits)


def open_wav(fh, name):
    """(WavInfo, data offset, data size) of a RIFF/WAVE file object, reading only the
    chunk headers and the fmt chunk: the samples stay in the file until read_blocks."""
    head = fh.read(12)
    if not is_wav(head):
        raise FormatError(f"{name}: not a RIFF/WAVE file (starts with {head!r})")
    file_size = fh.seek(0, 2)
    pos, fmt, data = 12, None, None
    while pos + 8 <= file_size:
        fh.seek(pos)
        chunk_id, size = struct.unpack("<4sI", fh.read(8))
        if chunk_id == b"fmt ":
            fmt = fh.read(min(size, 4096))  # 40 bytes matter; a huge size is read no further
        elif chunk_id == b"data":
            have = max(0, min(size, file_size - pos - 8))
            if have < size:
                raise FormatError(f"{name}: truncated data chunk: header says {size} bytes, file has {have}")
            data = (pos + 8, size)
        pos += 8 + size + (size & 1)  # chunks are padded to an even size
    if fmt is None:
        raise FormatError(f"{name}: WAV file has no 'fmt ' chunk")
    if data is None:
        raise FormatError(f"{name}: WAV file has no 'data' chunk")
    info = parse_fmt(fmt, name)
    frame = info.channels * info.bits // 8
    if data[1] % frame:
        raise FormatError(f"{name}: truncated data chunk: {data[1]} bytes is not a whole number of {frame}-byte frames")
    return info, data[0], data[1]


def read_blocks(fh, info, offset, size, frames_per_block=160000, use_numpy=None):
    """The data chunk decoded block by block (mono floats, as decode_wav returns them):
    memory stays at one block whatever the file's length."""
    frame = info.channels * info.bits // 8
    block = max(1, min(frames_per_block, MAX_BLOCK_BYTES // frame)) * frame  # 8 channels of f64 at 768 kHz stay small
    np = numpy_or_none(use_numpy)
    fh.seek(offset)
    left = size
    while left > 0:
        raw = fh.read(min(left, block))
        if not raw:
            return
        left -= len(raw)
        raw = raw[: len(raw) // frame * frame]
        yield _decode_numpy(np, raw, info) if np is not None else _decode_python(raw, info)


def decode_wav(data, name="<bytes>", use_numpy=None):
    """(mono float samples, WavInfo). Samples are an array('f') (pure Python)
    or a float32 numpy array (when numpy is used)."""
    fmt, raw = read_chunks(data, name)
    info = parse_fmt(fmt, name)
    frame = info.channels * info.bits // 8
    if len(raw) % frame:
        raise FormatError(f"{name}: truncated data chunk: {len(raw)} bytes is not a whole number "
                          f"of {frame}-byte frames")
    np = numpy_or_none(use_numpy)
    if np is not None:
        return _decode_numpy(np, raw, info), info
    return _decode_python(raw, info), info


def numpy_or_none(use_numpy):
    """numpy when wanted (None: if installed; True: required; False: never), else None."""
    if use_numpy is False:
        return None
    try:
        import numpy
    except ImportError:
        if use_numpy:
            raise
        return None
    return numpy


def _decode_numpy(np, raw, info):
    if info.format == IEEE_FLOAT:
        x = np.frombuffer(raw, "<f4" if info.bits == 32 else "<f8").astype(np.float64)
    elif info.bits == 8:
        x = (np.frombuffer(raw, np.uint8).astype(np.float64) - 128.0) / 128.0
    elif info.bits == 24:
        b = np.frombuffer(raw, np.uint8).reshape(-1, 3).astype(np.int32)
        x = ((b[:, 0] << 8) | (b[:, 1] << 16) | (b[:, 2] << 24)).astype(np.float64) / 2.0**31
    else:
        x = np.frombuffer(raw, "<i2" if info.bits == 16 else "<i4").astype(np.float64) / 2.0 ** (info.bits - 1)
    if info.channels > 1:
        x = x.reshape(-1, info.channels).mean(axis=1)
    with np.errstate(over="ignore"):  # float64 beyond float32 becomes inf, which stream.py's check reports
        return x.astype(np.float32)


def _decode_python(raw, info):
    if info.format == IEEE_FLOAT:
        values, scale = _typed(raw, "f" if info.bits == 32 else "d"), 1.0
    elif info.bits == 8:
        values = [b - 128 for b in bytes(raw)]
        scale = 1.0 / 128.0
    elif info.bits == 24:
        # Place each 3-byte sample in the top of a 4-byte int: the sign comes for free.
        n = len(raw) // 3
        wide = bytearray(4 * n)
        wide[1::4], wide[2::4], wide[3::4] = raw[0::3], raw[1::3], raw[2::3]
        values, scale = _typed(wide, "i"), 1.0 / 2.0**31
    else:
        values, scale = _typed(raw, "h" if info.bits == 16 else "i"), 1.0 / 2.0 ** (info.bits - 1)
    ch = info.channels
    if ch == 1:
        return array("f", [v * scale for v in values])
    scale /= ch
    lanes = [values[c::ch] for c in range(ch)]
    return array("f", [sum(frame) * scale for frame in zip(*lanes)])


def _typed(raw, code):
    a = array(code)
    if a.itemsize != {"h": 2, "i": 4, "f": 4, "d": 8}[code]:
        raise FormatError(f"this Python's array('{code}') is {a.itemsize} bytes; cannot decode WAV samples")
    a.frombytes(bytes(raw))
    if sys.byteorder == "big":
        a.byteswap()
    return a
