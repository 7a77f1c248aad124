"""launch from a script needs `if __name__ == "__main__":`; say so before any rank starts.

multiprocessing's forkserver start method (spawn's too) imports the script's main module again in every new
process (multiprocessing docs, "Safe importing of main module"). A launch at the top level of the script
runs again in each rank while it starts, where multiprocessing refuses to start processes ("An attempt has
been made to start a new process before the current process has finished its bootstrapping phase"), and the
rank dies with exit code 1. So launch reads the script (ast) when it is called from the script's top level,
and refuses at once, showing the line to move under the guard. A rank that imports the script again raises
the same message (its stderr is the terminal's), in case the source could not be read.
A notebook, `python -c` and `python -m pkg` (pkg/__main__.py) are not imported again: nothing to check.
"""
import ast
import multiprocessing.process
import os
import sys

from helpers.errors import LaunchError


def require_main_guard():
    """Raise LaunchError when launch is called from the top level of a script without the __main__ guard."""
    if getattr(multiprocessing.process.current_process(), "_inheriting", False):
        # A new rank importing the script again (as __mp_main__): launch was reached at its top level.
        frame = _module_frame(lambda g: g.get("__name__") == "__mp_main__")
        if frame is not None:
            raise LaunchError(guard_message(frame.f_code.co_filename, frame.f_lineno))
        return
    main = _reimported_main()
    frame = _module_frame(lambda g: g is main.__dict__) if main is not None else None
    if frame is not None and not _guarded(frame.f_code.co_filename, frame.f_lineno):
        raise LaunchError(guard_message(frame.f_code.co_filename, frame.f_lineno))


def _reimported_main():
    """The main module if multiprocessing imports it again in new processes (multiprocessing/spawn.py), else None."""
    main = sys.modules.get("__main__")
    name = getattr(getattr(main, "__spec__", None), "name", None)
    if name is not None and (name == "__main__" or name.endswith(".__main__")):
        return None  # python -m pkg: multiprocessing does not run pkg/__main__.py again
    path = getattr(main, "__file__", None)
    if not path or path.endswith(("ipython", "ipython3")):
        return None
    return main


def _module_frame(is_main):
    """The frame running a module's top-level code whose globals pass is_main, if launch was called from there."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "<module>" and is_main(frame.f_globals):
            return frame
        frame = frame.f_back
    return None


def _is_guard(node):
    """`if __name__ == "__main__":`, either way round."""
    if not (isinstance(node, ast.If) and isinstance(node.test, ast.Compare) and len(node.test.ops) == 1
            and isinstance(node.test.ops[0], ast.Eq)):
        return False
    sides = [node.test.left, *node.test.comparators]
    return "__name__" in {getattr(s, "id", None) for s in sides} and "__main__" in {getattr(s, "value", None)
                                                                                   for s in sides}


def _guarded(path, lineno):
    """Whether line lineno of the script is inside the body of an `if __name__ == "__main__":` (True if unreadable)."""
    try:
        with open(path) as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError):
        return True  # cannot tell: let multiprocessing speak
    return any(_is_guard(node) and node.body[0].lineno <= lineno <= node.body[-1].end_lineno
               for node in ast.walk(tree))


def guard_message(path, lineno):
    """What is wrong, where, and the lines to write instead."""
    name = os.path.basename(path)
    try:
        with open(path) as f:
            line = f.read().splitlines()[lineno - 1].strip()
    except (OSError, IndexError):
        line = "launch(...)"
    return (f"launch() is called at the top level of {name} (line {lineno}: {line}), outside an "
            f'`if __name__ == "__main__":` block. Every rank\'s process imports {name} again (multiprocessing\'s '
            f"forkserver does, as spawn does) and would run that line again inside the rank. Put the call "
            f"under the guard, at the end of {name}:\n\n"
            f'    if __name__ == "__main__":\n        {line}\n')


def bootstrap_hint():
    """For a rank that died before its worker ran: what multiprocessing did then, and what to check."""
    main = _reimported_main()
    if main is None:
        return "Its traceback, if any, is in the terminal that started this kernel."
    name = os.path.basename(main.__file__)
    return (f"multiprocessing imports {name} again in every rank before the rank runs, and the rank failed there "
            f"(its traceback is in the terminal). If {name} calls launch(...) or does other work at its top level, "
            f'move that under `if __name__ == "__main__":`.')
