"""What the grader keeps of a message the student's kernel sends on iopub: its content in the protocol's shapes, or
nothing.

The kernel is the student's: a cell can send any message (`get_ipython().kernel.session.send(...)`, raw JSON bytes
included), and nbclient turns each into an output trusting the Jupyter protocol's shapes. A malformed one raised an
exception nothing caught: the student's grading process died, `grader_error` on every re-grade, a blank LMS grade.
`cleaned` makes each field its protocol type (https://jupyter-client.readthedocs.io/en/stable/messaging.html) or
drops the message; the executed notebook says how many were dropped (execute.py):

| msg_type | kept, each as the protocol types it |
|---|---|
| stream | `name` stdout or stderr (else stdout), `text` a str (a list of str joined; else empty) |
| display_data, execute_result, update_display_data | `data` {mime type: str, any JSON for a JSON mime type}, a |
|   | PNG or JPEG only if it is base64; `metadata` a dict; `transient.display_id` a str; `execution_count` an int |
| error | `ename`, `evalue` str; `traceback` [str] |
| clear_output | `wait` a bool |
| status | `execution_state` a str, else dropped |
| any other (execute_input, comm_*, unknown) | as sent: nbclient ignores it or raises, and a raise drops it |
| every type | `execution_count` (nbclient copies it to the cell from any message) an int or None |

In every message: half a surrogate pair (JSON's "\\ud800") becomes U+FFFD (the executed notebook, a UTF-8 file, could
not hold it), and a content nested deeper than MAX_DEPTH is dropped (writing and validating the notebook recurse).
A message that cannot even be decoded (not JSON, a bad signature) is dropped where it is received (execute.py).
"""
import base64
import binascii
import inspect
import re

from jupyter_core.utils import run_sync
from nbclient.exceptions import CellExecutionComplete

MAX_DEPTH = 32  # the protocol's contents nest 3 deep; a JSON mime bundle a few more
_SURROGATE = re.compile("[\ud800-\udfff]")
_MIME = re.compile(r"[a-zA-Z0-9]+/[a-zA-Z0-9\-+.]+")
_JSON_MIME = re.compile(r"application/(.*\+)?json")
_BASE64 = ("image/png", "image/jpeg")
_OUTPUTS = {"display_data", "execute_result", "update_display_data"}


class WellFormed:
    """A NotebookClient mixin: each iopub message is `cleaned` before nbclient reads it, and one that still makes it
    raise, or cannot be decoded, is dropped; `dropped` counts them (execute.py notes each cell's in its outputs)."""

    dropped = 0

    def process_message(self, msg, cell, cell_index):
        clean = cleaned(msg)
        if clean is not None:
            try:
                return super().process_message(clean, cell, cell_index)
            except CellExecutionComplete:  # the cell's end, as nbclient signals it
                raise
            except Exception:  # noqa: BLE001 - whatever a message makes nbclient raise, it is the student's
                pass
        self.dropped += 1
        return None

    async def async_start_new_kernel_client(self):
        kc = await super().async_start_new_kernel_client()
        channel = kc.iopub_channel
        receive = channel._recv  # frames -> message: a bad signature, or JSON that is not, raised here
        if not inspect.iscoroutinefunction(receive):  # nbclient's clients are asynchronous; another is left as is
            return kc

        async def recv(**kwargs):
            try:
                return await receive(**kwargs)
            except Exception:  # noqa: BLE001 - the frames are consumed: the next get_msg reads the next message
                self.dropped += 1
                return {"msg_type": "", "header": {}, "parent_header": {}, "content": {}, "metadata": {}}

        channel._recv = recv
        return kc

    start_new_kernel_client = run_sync(async_start_new_kernel_client)


class Malformed(ValueError):
    """A message the grader drops."""


def cleaned(msg):
    """A copy of msg (a deserialized message) with its content in the protocol's shapes; None: drop it."""
    try:
        if not isinstance(msg, dict) or not isinstance(msg.get("content"), dict):
            raise Malformed("no content")
        msg_type = msg.get("msg_type")
        if not isinstance(msg_type, str) or not isinstance(msg.get("parent_header"), dict):
            raise Malformed("no type or parent")
        content = _plain(msg["content"])
        shape = _SHAPES.get(msg_type)
        content = shape(content) if shape else content
        if msg_type == "execute_result" or "execution_count" in content:  # nbclient sets the cell's from any type
            count = content.get("execution_count")
            content["execution_count"] = count if isinstance(count, int) and not isinstance(count, bool) else None
        header = _plain(msg.get("header")) if isinstance(msg.get("header"), dict) else {}
        return {**msg, "msg_type": msg_type, "header": {**header, "msg_type": msg_type}, "content": content,
                "metadata": _plain(msg.get("metadata")) if isinstance(msg.get("metadata"), dict) else {}}
    except (Malformed, RecursionError):
        return None


def _plain(value):
    """value (decoded JSON) copied, its strings and keys without lone surrogates; Malformed beyond MAX_DEPTH."""
    root = [None]
    stack = [(root, 0, value, 0)]  # (container, key, value, depth): fill container[key] with value's copy
    while stack:
        into, key, item, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise Malformed("too deep")
        if isinstance(item, dict):
            into[key] = copy = {}
            stack += [(copy, _text(k), v, depth + 1) for k, v in item.items()]
        elif isinstance(item, (list, tuple)):
            into[key] = copy = [None] * len(item)
            stack += [(copy, i, v, depth + 1) for i, v in enumerate(item)]
        else:
            into[key] = _text(item) if isinstance(item, str) else item
    return root[0]


def _text(value):
    return _SURROGATE.sub("\ufffd", value) if isinstance(value, str) else str(value)


def _str(value):
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "".join(value)
    return value if isinstance(value, str) else ""


def _stream(content):
    name = content.get("name")
    return {"name": name if name in ("stdout", "stderr") else "stdout", "text": _str(content.get("text"))}


def _output(content):
    data = content.get("data") if isinstance(content.get("data"), dict) else {}
    kept = {}
    for mime, value in data.items():
        if not _MIME.fullmatch(mime):
            continue
        if _JSON_MIME.fullmatch(mime):
            kept[mime] = value
            continue
        value = _str(value) if isinstance(value, (str, list)) else None
        if value is None or (mime in _BASE64 and not _is_base64(value)):
            continue
        kept[mime] = value
    shaped = {"data": kept, "metadata": content["metadata"] if isinstance(content.get("metadata"), dict) else {}}
    if "execution_count" in content:
        shaped["execution_count"] = content["execution_count"]
    transient = content.get("transient")
    if isinstance(transient, dict) and isinstance(transient.get("display_id"), str):
        shaped["transient"] = {"display_id": transient["display_id"]}
    return shaped


def _is_base64(text):
    try:
        base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError):
        return False
    return True


def _error(content):
    traceback = content.get("traceback")
    return {"ename": _str(content.get("ename")), "evalue": _str(content.get("evalue")),
            "traceback": [t for t in traceback if isinstance(t, str)] if isinstance(traceback, list) else []}


def _clear(content):
    return {"wait": content.get("wait") is True}


def _status(content):
    if not isinstance(content.get("execution_state"), str):
        raise Malformed("no execution_state")
    return {"execution_state": content["execution_state"]}


_SHAPES = {"stream": _stream, "display_data": _output, "execute_result": _output, "update_display_data": _output,
           "error": _error, "clear_output": _clear, "status": _status}
