"""File plumbing shared by every module that reads inputs or writes results.

* :func:`atomic_write_bytes` / :func:`atomic_write_text`: write via a temporary file in the same
  folder and a rename, so a reader (or an interrupted run) never sees half a file.
* :func:`not_a_file`: why a path given as an input file is none (a folder, or missing).
* :func:`read_yaml`: a YAML mapping with one-line errors (file, line) that refuses a key given
  twice in one mapping (PyYAML silently keeps the last).
* :func:`check_keys`: refuse a key a hand-read input mapping (a calibration file) does not know,
  naming the file, the key's path and the keys allowed there.
* :func:`file_digest`: content hash of an input file, cached by (path, mtime, size).
* :func:`json_default`: ``json.dumps`` hook for numpy scalars and arrays.
* :func:`disk_cached`: a JSON value computed once per machine, keyed by a hash of its inputs
  and the package version (fits that cost a cold process half a second);
  :func:`disk_cached_arrays` the same for numpy arrays (a parsed trace: reading it again would
  import pandas, a third of a cold what-if point).

Nothing here knows about scenarios or engines.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import re
import secrets
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from ._version import __version__
from .errors import ConfigError

__all__ = ["atomic_write_bytes", "atomic_write_text", "read_yaml", "load_yaml", "not_a_file", "check_keys", "file_digest",
           "json_default", "yaml_loader",
           "cache_dir", "disk_cached", "disk_cached_arrays", "MAX_EXACT_COUNT", "CACHE_ENV", "check_writable_dir"]


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temporary file in the same folder, fsync, rename).

    The temporary file is created with mode 0o666 filtered by the process umask (as a plain
    ``open`` would), so results keep the permissions users expect.

    Args:
        path: the destination file; missing parent folders are created.
        data: the whole new content.

    Raises:
        OSError: the folder cannot be created or written (the temporary file is removed first);
            its ``filename`` is ``path`` where the failing call named none (a full disk) or named
            the temporary file. IsADirectoryError: ``path`` is a folder (nothing is written).

    Source:
        :func:`os.replace` is an atomic rename on POSIX (``rename(2)``) when source and
        destination are on one file system, hence the temporary file in the same folder.
    """
    path = Path(path)
    if path.is_dir():  # checked first: the rename would fail naming the temporary file, a name nobody chose
        raise IsADirectoryError(errno.EISDIR, "is a directory; give the path of a file to write", str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        if e.filename is None or e.filename == str(tmp):  # a full disk names no file: name the destination
            raise OSError(e.errno, e.strerror, str(path)) from e
        raise
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """:func:`atomic_write_bytes` of UTF-8 text.

    Args:
        path: the destination file; missing parent folders are created.
        text: the whole new content, encoded as UTF-8.

    Raises:
        OSError: from :func:`atomic_write_bytes`.
    """
    atomic_write_bytes(path, text.encode("utf-8"))


def json_default(o: Any) -> Any:
    """``json.dumps(default=...)`` hook: numpy scalars and arrays as plain numbers and lists.

    Args:
        o: the object :mod:`json` could not serialise.

    Returns:
        ``o.item()`` for a numpy scalar, ``o.tolist()`` for an ``np.ndarray`` (any shape/dtype).

    Raises:
        TypeError: anything else (the contract of ``default`` in the :mod:`json` documentation).
    """
    import numpy as np  # numpy is always installed; imported here to keep this module light

    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


_DIGESTS: dict[tuple[str, int, int], str] = {}


def file_digest(path: str | os.PathLike[str]) -> str:
    """First 16 hex digits of the SHA-256 of a file's contents (cached by path, mtime and size).

    Args:
        path: the file, read in 1 MiB chunks.

    Returns:
        16 lowercase hex characters (64 bits of the digest).

    Raises:
        OSError: the file cannot be read.

    Source:
        SHA-256 as in FIPS 180-4, via :func:`hashlib.sha256`.
    """
    p = Path(path)
    st = p.stat()
    key = (str(p), st.st_mtime_ns, st.st_size)
    if key not in _DIGESTS:
        h = hashlib.sha256()
        with p.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        _DIGESTS[key] = h.hexdigest()[:16]
    return _DIGESTS[key]


_BaseLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the C parser when libyaml is there


class _UniqueKeyLoader(_BaseLoader):  # type: ignore[misc, valid-type]
    """Safe loader that refuses a key given twice in one mapping."""


def _construct_unique_mapping(loader: Any, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            hash(key)
        except TypeError:  # (a list or mapping as a key: the safe constructor's own error, which the check below preempted)
            raise yaml.constructor.ConstructorError("while constructing a mapping", node.start_mark,
                                                    "found unhashable key", key_node.start_mark) from None
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"key {key!r} is given twice", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


def _construct_timestamp(loader: Any, node: yaml.ScalarNode) -> Any:
    # YAML 1.1 reads 2020-13-45 as a date, and datetime's ValueError named no line
    try:
        return yaml.constructor.SafeConstructor.construct_yaml_timestamp(loader, node)
    except ValueError as e:
        raise yaml.constructor.ConstructorError(None, None, f"{node.value!r} is not a date ({e})",
                                                node.start_mark) from None


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_unique_mapping)
_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:timestamp", _construct_timestamp)
# YAML 1.2 floats: PyYAML follows YAML 1.1, where a float needs a dot and a signed exponent, so
# `1e-3`, `5e6` and `1.0e5` were strings and a number field said "not a number" (a user's report).
# Integers keep their own resolver, which is tried first.
_UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9][0-9_]*)[eE][-+]?[0-9]+$"),
    list("-+0123456789."))

#: The loader every YAML this package reads goes through (safe, unique keys, YAML 1.2 floats,
#: the C parser when available): :func:`read_yaml` and :func:`load_yaml`.
yaml_loader = _UniqueKeyLoader


def load_yaml(text: str) -> Any:
    """Parse YAML text with :data:`yaml_loader` (safe; a key given twice is refused; ``1e-3`` is a
    float as in YAML 1.2).

    Raises:
        yaml.YAMLError: the text is not valid YAML or repeats a key (callers name their file); a
            construction the parser's marks do not cover (nesting too deep for Python's stack, or
            another constructor's ValueError or TypeError) as a plain ``yaml.YAMLError`` with its words.
    """
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a safe loader
    except RecursionError:
        raise yaml.YAMLError("nested too deeply") from None
    except (ValueError, TypeError) as e:  # (the input's, raised by a constructor: every caller catches YAMLError)
        raise yaml.YAMLError(str(e)) from None


def yaml_error_text(e: yaml.YAMLError) -> str:
    """What is wrong with a YAML text, for a one-line error after its file's name: ``not valid YAML
    at line 2, column 1: found character that cannot start any token``, with what the parser was
    reading and where that began when elsewhere: first for a flow collection or a quoted scalar
    (``not valid YAML while parsing a flow mapping at line 37, column 3: expected ',' or '}', but
    got '<block end>' at line 38, column 1``: the unclosed bracket or quote is the mistake), else in
    parentheses after the problem.

    Args:
        e: a PyYAML error (a ``MarkedYAMLError`` carries the marks; a reader's error, or a bare
            ``yaml.YAMLError``, gives its words, with the position in them where it has one).
    """
    mark, problem = getattr(e, "problem_mark", None), getattr(e, "problem", None)
    context, context_mark = getattr(e, "context", None), getattr(e, "context_mark", None)
    at = (lambda m: f"line {m.line + 1}, column {m.column + 1}")
    words = problem if problem else (str(e) if not hasattr(e, "problem") else "")  # (a reader's error, or a bare one)
    words = " ".join(str(words).split())
    text = "not valid YAML" + (f" at {at(mark)}" if mark is not None else "") + (f": {words}" if words else "")
    if context and context_mark is not None and (mark is None or (context_mark.line, context_mark.column)
                                                 != (mark.line, mark.column)):
        context = " ".join(str(context).split())
        if "flow" in context or "quoted" in context:
            # where it began first: an unclosed { [ ' " is the mistake, found only lines later
            found = f" at {at(mark)}" if mark is not None else ""
            return f"not valid YAML {context} at {at(context_mark)}: {words}{found}"
        text += f" ({context} at {at(context_mark)})"
    return text


def not_a_file(path: str | os.PathLike[str], what: str = "file") -> str | None:
    """Why ``path`` cannot be read as an input file, or None when it is one.

    A folder is told apart from a missing path: "not found" for a path that exists misleads.

    Args:
        path: the path as the message should show it.
        what: what the file holds, e.g. ``"trace file"``.

    Returns:
        ``"<path>: is a directory, not a <what>; ..."``, ``"<path>: <what> not found"``, or None.
    """
    p = Path(path)
    if p.is_file():
        return None
    if p.is_dir():
        return f"{path}: is a directory, not {'an' if what[:1] in 'aeiou' else 'a'} {what}; give the path of the file itself"
    return f"{path}: {what} not found"


def read_yaml(path: str | os.PathLike[str], *, error: type[Exception] = ConfigError,
              what: str = "a mapping at the top level") -> dict[str, Any]:
    """Read a YAML file whose top level is a mapping.

    Args:
        path: the file.
        error: exception class raised on any problem (``ConfigError`` or ``CalibrationError``).
        what: what the top level should hold, for the message.

    Returns:
        The top-level mapping, as PyYAML's safe loader builds it.

    Raises:
        ConfigError: (or the given ``error`` class) missing file, a folder, unreadable file, not UTF-8, invalid
            YAML (with its line), a key given twice, or a top level that is not a mapping. One
            line naming the file.

    Source:
        PyYAML ``SafeLoader`` (``CSafeLoader`` when libyaml is present); refusing a repeated key
        follows the YAML 1.2 specification ("each of the keys is unique" in a mapping).
    """
    p = Path(path)
    why = not_a_file(path)
    if why is not None:
        raise error(why)
    try:
        doc = load_yaml(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise error(f"{path}: cannot read ({e.strerror})") from None
    except UnicodeDecodeError:
        raise error(f"{path}: not a UTF-8 text file") from None
    except yaml.YAMLError as e:
        raise error(f"{path}: {yaml_error_text(e)}") from None
    if not isinstance(doc, dict):
        raise error(f"{path}: expected {what}")
    return doc


#: In a :func:`check_keys` schema: a mapping whose keys are the user's (a column filter, named
#: drafters); with ``{ANY_KEY: schema}``, each of its values follows ``schema``.
ANY_KEY = "*"


def check_keys(doc: Any, schema: dict[str, Any], where: str, *, error: type[Exception] = ConfigError,
               path: str = "") -> None:
    """Refuse a key that ``schema`` does not know, anywhere in ``doc`` (a misspelled optional key
    would otherwise be read as missing, and its default used without a word).

    Args:
        doc: the parsed mapping (anything else is left to the reader's own checks).
        schema: the keys allowed: each maps to None (any value), to the schema of its value when
            that value is a mapping, or is :data:`ANY_KEY` (see there).
        where: the file, the start of the message; error: the exception raised.
        path: the dotted path of ``doc`` in the file (for the message).

    Raises:
        ``error``: one line, ``"{where}: {path.key}: unknown key; allowed: ..."``.
    """
    if not isinstance(doc, dict):
        return
    if ANY_KEY in schema:
        for k, v in doc.items():
            if schema[ANY_KEY] is not None:
                check_keys(v, schema[ANY_KEY], where, error=error, path=f"{path}{k}.")
        return
    for k, v in doc.items():
        if k not in schema:
            raise error(f"{where}: {path}{k}: unknown key; allowed: {', '.join(sorted(schema))}")
        if schema[k] is not None:
            check_keys(v, schema[k], where, error=error, path=f"{path}{k}.")


def check_writable_dir(folder: str | os.PathLike[str], flag: str = "--out") -> None:
    """Check now, before any work, that files can be written in ``folder`` (created if missing).

    Args:
        folder: the output folder.
        flag: the option that named it, for the message.

    Raises:
        ConfigError: the folder cannot be created or written (one line naming it and ``flag``).
    """
    folder = Path(folder)
    probe = folder / f".write-check-{secrets.token_hex(4)}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(probe, b"")
        probe.unlink()
    except OSError as e:
        raise ConfigError(f"{folder}: cannot write results here ({e.strerror}); choose another {flag}") from None


#: Environment variable naming the disk-cache folder; ``off`` (or ``0``, ``none``) disables it.
CACHE_ENV = "MEMTP_SIM_CACHE_DIR"


def cache_dir() -> Path | None:
    """The disk-cache folder: ``$MEMTP_SIM_CACHE_DIR``, else ``$XDG_CACHE_HOME/memtp_sim``, else
    ``~/.cache/memtp_sim``; None when the variable says ``off``, ``0``, ``none``, ``false`` or ``no``."""
    env = os.environ.get(CACHE_ENV, "").strip()
    if env.lower() in ("off", "0", "none", "false", "no"):
        return None
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME", "").strip() or str(Path.home() / ".cache")
    return Path(base) / "memtp_sim"


#: the largest whole number a float64 (hence a number read from CSV or JSON) holds exactly; counts
#: read as floats are refused above it (an int64 cast of 2^63 or more wraps to negative)
MAX_EXACT_COUNT = 2**53


def _cache_file(kind: str, inputs: Any, suffix: str) -> Path | None:
    """Where :func:`disk_cached` keeps ``kind`` for ``inputs`` (None: caching is off)."""
    folder = cache_dir()
    if folder is None:
        return None
    digest = hashlib.sha256(repr((kind, inputs, __version__)).encode("utf-8")).hexdigest()[:32]
    return folder / f"{kind}-{digest}{suffix}"


def disk_cached(kind: str, inputs: Any, compute: Any) -> Any:
    """``compute()`` once per machine for the same ``inputs``: the JSON result is kept in
    :func:`cache_dir` under ``kind-<sha256 of (kind, inputs, package version)>.json``.

    Args:
        kind: what is cached (a file-name prefix), e.g. ``sts``.
        inputs: everything the result depends on; its ``repr`` is hashed, so it must be
            deterministic (tuples of numbers and strings).
        compute: a function of no arguments returning a JSON-ready value (lists, floats, str).

    Returns:
        The cached or freshly computed value (floats round-trip exactly through JSON).

    An unreadable, corrupt or unwritable cache never fails a run: the value is computed and,
    when the folder is writable, written atomically (:func:`atomic_write_text`).
    """
    path = _cache_file(kind, inputs, ".json")
    if path is None:
        return compute()
    try:
        return json.loads(path.read_text(encoding="utf-8"))["value"]
    except (OSError, ValueError, KeyError, TypeError):
        pass  # not cached yet, or unreadable: compute it
    value = compute()
    try:
        atomic_write_text(path, json.dumps({"kind": kind, "inputs": repr(inputs), "value": value}))
    except OSError:
        pass  # a read-only home still runs, uncached
    return value


def disk_cached_arrays(kind: str, inputs: Any, compute: Any, keys: tuple[str, ...]) -> dict[str, np.ndarray]:
    """:func:`disk_cached` for numpy arrays: ``compute()`` returns ``{name: array}`` (numeric or
    fixed-width string arrays), kept as ``kind-<digest>.npz`` (exact, and ~100x faster to read
    than JSON for large arrays).

    Args:
        kind: what is cached (a file-name prefix), e.g. ``trace``.
        inputs: everything the arrays depend on (deterministic ``repr``).
        compute: a function of no arguments returning ``{name: np.ndarray}``.
        keys: the names ``compute`` returns; a cached file with other names is computed again.

    Returns:
        The cached or freshly computed arrays.

    An unreadable, corrupt or unwritable cache never fails a run (as :func:`disk_cached`);
    ``compute``'s exceptions propagate and nothing is written.
    """
    path = _cache_file(kind, inputs, ".npz")
    if path is None:
        return compute()
    try:
        with np.load(path, allow_pickle=False) as z:
            if sorted(z.files) == sorted(keys):
                return {k: z[k] for k in z.files}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        pass  # not cached yet, or unreadable: compute it
    value = compute()
    buf = io.BytesIO()
    np.savez(buf, **value)
    try:
        atomic_write_bytes(path, buf.getvalue())
    except OSError:
        pass  # a read-only home still runs, uncached
    return value
