"""How a command's result or failure reaches the user, shared by every command.

A command computes a report and hands it to `emit`: JSON on stdout with `--json`, otherwise a
human rendering. `guarded` wraps each command and maps exceptions to the CLI's exit codes (0
success, 2 bad input with one clear message, 1 a failure while running, the traceback only with
`--debug` or STAGEWISE_DEBUG=1), reporting failures through the same JSON channel as results
so `--json` callers always get one JSON document. Keeping this in one place is what makes the
commands behave alike.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Callable

import typer

from stagewise.data.errors import BadInput  # the one bad-input type (recipe.errors.RecipeError is the same class)

DEBUG = {"on": False}  # set by the top-level --debug option
_JSON_OUT: dict[str, Any] = {"file": None}  # the real stdout while --json sends other prints to stderr




def jsonable(obj: Any) -> Any:
    """Reports from the libraries (dataclasses, pydantic models, Paths) as plain JSON data."""
    if hasattr(obj, "to_dict"):
        return jsonable(obj.to_dict())
    if hasattr(obj, "model_dump"):
        return obj.model_dump(mode="json")
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return jsonable({f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)})
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    return obj


def emit(data: Any, as_json: bool, text: Callable[[], None] | None = None) -> None:
    """JSON on stdout, or the human rendering (default: key: value lines)."""
    if as_json:
        typer.echo(json.dumps(jsonable(data), indent=2), file=_JSON_OUT["file"])
    elif text is not None:
        text()
    else:
        print_tree(jsonable(data))


def print_tree(data: Any, indent: int = 0) -> None:
    """Nested dicts and lists as indented `key: value` and `- item` lines."""
    pad = "  " * indent
    if isinstance(data, dict):
        for k, v in data.items():
            if isinstance(v, (dict, list)) and v:
                typer.echo(f"{pad}{k}:")
                print_tree(v, indent + 1)
            else:
                typer.echo(f"{pad}{k}: {v}")
    elif isinstance(data, list):
        for v in data:
            if isinstance(v, (dict, list)):
                typer.echo(f"{pad}-")
                print_tree(v, indent + 1)
            else:
                typer.echo(f"{pad}- {v}")
    else:
        typer.echo(f"{pad}{data}")


def fail(message: str, code: int, as_json: bool) -> None:
    """Report a failure (a JSON document with --json, else `error: ...` on stderr) and exit."""
    if as_json:
        emit({"ok": False, "exit_code": code, "error": message}, True)
    else:
        typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def debugging(flag: bool = False) -> bool:
    """Whether this command shows tracebacks: its --debug, the top-level `stagewise --debug`, or STAGEWISE_DEBUG=1."""
    return flag or DEBUG["on"] or os.environ.get("STAGEWISE_DEBUG", "") not in ("", "0")


def guarded(fn: Callable) -> Callable:
    """Map exceptions to exit codes: bad input 2 (message only), a failure 1 (+ traceback on --debug).

    With --json, stdout carries only the JSON document: whatever the work prints meanwhile
    (progress bars, library chatter) is sent to stderr.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        as_json = bool(kwargs.get("as_json"))
        debug = debugging(bool(kwargs.get("debug")))
        _JSON_OUT["file"] = sys.stdout
        try:
            with contextlib.redirect_stdout(sys.stderr) if as_json else contextlib.nullcontext():
                return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort):
            raise
        except BadInput as e:
            fail(str(e), 2, as_json)
        except KeyboardInterrupt:
            fail("interrupted", 130, as_json)
        except Exception as e:  # a failure while running
            if debug:
                traceback.print_exc(file=sys.stderr)
            hint = "" if debug else "\n(run with --debug or STAGEWISE_DEBUG=1 for the traceback)"
            fail(f"{type(e).__name__}: {e}{hint}", 1, as_json)

    return wrapper
