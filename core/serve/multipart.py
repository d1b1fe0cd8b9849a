"""multipart/form-data uploads streamed to a temporary file as they arrive, so an upload of
any size (up to --max-upload-mb, counted in app.py) costs a few chunks of memory.

One file part (the audio) goes to disk; the other parts are short text fields."""
import asyncio
import contextlib
import os
import re
import tempfile

from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header

from .errors import ApiError, bad_request

MAX_FIELDS = 32
MAX_FIELD_BYTES = 64 * 1024


class Upload:
    """After receive(): .path (the file part on disk, or None), .filename, .fields {name: [str]}.
    remove() deletes the file."""

    def __init__(self, directory):
        self.directory = directory
        self.fields = {}
        self.path = self.filename = None
        self._file = None
        self._name = self._header = self._value = b""
        self._headers = {}
        self._data = bytearray()
        self._ended = False

    # ---- python_multipart's callbacks -------------------------------------------------------
    def _part_begin(self):
        self._headers, self._data = {}, bytearray()

    def _header_field(self, data, start, end):
        self._header += data[start:end]

    def _header_value(self, data, start, end):
        self._value += data[start:end]

    def _header_end(self):
        self._headers[self._header.lower()] = self._value
        self._header = self._value = b""

    def _headers_finished(self):
        _, options = parse_options_header(self._headers.get(b"content-disposition", b""))
        if b"name" not in options:
            raise bad_request("a multipart part has no Content-Disposition name")
        self._name = options[b"name"]
        if b"filename" in options:
            if self.path is not None:
                raise bad_request("send one file per request", param="file")
            self.filename = options[b"filename"].decode("utf-8", "replace")
            fd, self.path = tempfile.mkstemp(prefix="tallow-upload-", suffix=_suffix(self.filename),
                                             dir=self.directory)
            self._file = os.fdopen(fd, "wb")
        elif sum(len(v) for v in self.fields.values()) >= MAX_FIELDS:
            raise bad_request(f"more than {MAX_FIELDS} form fields")

    def _part_data(self, data, start, end):
        if self._file is not None:
            self._file.write(data[start:end])
            return
        self._data += data[start:end]
        if len(self._data) > MAX_FIELD_BYTES:
            name = self._name.decode("utf-8", "replace")
            raise bad_request(f"the form field {name!r} is longer than {MAX_FIELD_BYTES} bytes", param=name)

    def _part_end(self):
        if self._file is not None:
            self._file.close()
            self._file = None
            self.fields.setdefault(self._name.decode("utf-8", "replace"), []).append(None)
            return
        try:
            value = self._data.decode("utf-8")
        except UnicodeDecodeError:
            raise bad_request(f"the form field {self._name.decode('utf-8', 'replace')!r} is not UTF-8") from None
        self.fields.setdefault(self._name.decode("utf-8", "replace"), []).append(value)

    def _end(self):
        self._ended = True

    # ---- the request ------------------------------------------------------------------------
    async def receive(self, request, deadline, timeout):
        kind, options = parse_options_header(request.headers.get("content-type", ""))
        if kind != b"multipart/form-data" or not options.get(b"boundary"):
            raise bad_request("send the audio as multipart/form-data (a 'file' part and text fields)")
        callbacks = {"on_part_begin": self._part_begin, "on_header_field": self._header_field,
                     "on_header_value": self._header_value, "on_header_end": self._header_end,
                     "on_headers_finished": self._headers_finished, "on_part_data": self._part_data,
                     "on_part_end": self._part_end, "on_end": self._end}
        try:
            parser = MultipartParser(options[b"boundary"], callbacks)
            remaining = max(0.0, deadline - asyncio.get_running_loop().time())
            await asyncio.wait_for(self._feed(request, parser), remaining)
        except asyncio.TimeoutError:
            self.remove()
            raise ApiError(408, f"the upload did not arrive within {timeout:g} s (tallow serve --request-timeout)",
                           code="request_timeout") from None
        except FormParserError as e:
            self.remove()
            raise bad_request(f"the multipart body is malformed: {e}") from None
        except BaseException:
            self.remove()
            raise
        if not self._ended:
            self.remove()
            raise bad_request("the multipart body ends before its closing boundary")
        return self

    async def _feed(self, request, parser):
        async for chunk in request.stream():
            parser.write(chunk)

    def field(self, name):
        """The last value of a text field, or None."""
        values = [v for v in self.fields.get(name, ()) if v is not None]
        return values[-1] if values else None

    def remove(self):
        if self._file is not None:
            self._file.close()
            self._file = None
        if self.path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
            self.path = None


def _suffix(filename):
    """The upload's extension when it is a plain one (ffmpeg and the WAV reader look at it)."""
    ext = os.path.splitext(filename)[1]
    return ext if re.fullmatch(r"\.[A-Za-z0-9]{1,8}", ext) else ""
