"""nixl.logging on pdx: get_logger(name) gives a logger under 'nixl'
printing NIXL's format ("<time> NIXL <level> <file>:<line> <message>")
to stderr, level from $NIXL_LOG_LEVEL (default INFO), configured once."""
import logging as _logging
import os as _os

_configured = False


def _configure():
    global _configured
    if _configured:
        return
    root = _logging.getLogger("nixl")
    if not root.handlers:
        h = _logging.StreamHandler()
        h.setFormatter(_logging.Formatter(
            "%(asctime)s NIXL %(levelname)-7s %(filename)s:%(lineno)d "
            "%(message)s"))
        root.addHandler(h)
    level = _os.environ.get("NIXL_LOG_LEVEL", "INFO").upper()
    root.setLevel(getattr(_logging, level, _logging.INFO))
    root.propagate = False
    _configured = True


def get_logger(name=None):
    """A logger named nixl.<name> (or 'nixl')."""
    _configure()
    if not name or name == "nixl":
        return _logging.getLogger("nixl")
    if name.startswith("nixl."):
        return _logging.getLogger(name)
    return _logging.getLogger("nixl." + name)
