"""Print the JupyterLab options `make lab` needs on this machine, and say why on stderr.

| machine                                          | option       | why                                     |
|--------------------------------------------------|--------------|-----------------------------------------|
| running as root (containers, cloud notebooks)    | --allow-root | jupyter refuses to start as root        |
|                                                  |              | without it                              |
| Linux with neither DISPLAY nor WAYLAND_DISPLAY   | --no-browser | no browser can open there; JupyterLab   |
|   (a headless server, ssh, a container)          |              | prints its URL with the token instead   |

Standard library only, like scripts/pip_install_args.py.
"""
import os
import sys


def lab_args(euid, platform, environ):
    """The extra `jupyter lab` options for a user id, a sys.platform and an environment."""
    args = []
    if euid == 0:
        args.append("--allow-root")
    headless = platform.startswith("linux") and not (environ.get("DISPLAY") or environ.get("WAYLAND_DISPLAY"))
    if headless:
        args.append("--no-browser")
    return args


def main():
    euid = os.geteuid() if hasattr(os, "geteuid") else -1  # Windows has no user ids
    args = lab_args(euid, sys.platform, os.environ)
    if "--no-browser" in args:
        print("No display here: open the http://127.0.0.1:...?token=... URL JupyterLab prints below "
              "(over ssh: ssh -L 8888:127.0.0.1:8888 this-host, then that URL on your machine).",
              file=sys.stderr)
    print(" ".join(args))


if __name__ == "__main__":
    main()
