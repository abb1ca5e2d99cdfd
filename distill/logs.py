"""Logging: our stage messages on the console, the libraries' chatter below it.

Our packages log under four names (:data:`OUR_LOGGERS`: ``distill.job.pipeline``'s "=== stage: ..." banners,
``teachers.finetune``'s dev metrics, ...). Two things make them readable wherever the code runs:

- :func:`install_default_handler` (called when ``distill`` is imported) gives each of our loggers level INFO and a
  :class:`DefaultHandler` that prints to stderr *only while the application has configured no logging of its own*
  (the root logger has no handlers). So ``distill.run_pipeline(...)`` in a plain script or a notebook shows its
  stages, and an application that calls ``logging.basicConfig`` (as the command line does) or adds handlers gets
  every record once, through its own handlers. A level the application set on our loggers is kept.
- :func:`quiet_libraries` sets the loggers of the libraries we drive (ONNX export, hub clients, ``datasets``,
  ``transformers``, ...) to WARNING unless the application set their level: their INFO lines (about 36
  "onnx_ir ... Replaced initializer" lines per ONNX export) are not news to a user of this package.

A library usually attaches only a ``NullHandler`` and leaves all output to the application; we depart from that
because a distillation job runs for minutes to hours and a run with no stage messages looks hung (``transformers``
does the same for its warnings: its own stderr handler on its library logger).
"""

from __future__ import annotations

import logging
import sys
from contextlib import contextmanager

OUR_LOGGERS = ("distill", "teachers", "students", "augment")
LIBRARY_LOGGERS = (
    "onnx_ir", "onnxscript", "onnxruntime", "onnx", "torch.onnx", "torch.export", "torch._dynamo", "torch.fx",
    "httpx", "httpcore", "urllib3", "requests", "huggingface_hub", "datasets", "transformers", "accelerate",
    "filelock", "fsspec", "gensim", "smart_open", "nltk", "matplotlib", "PIL", "sentence_transformers",
)
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class DefaultHandler(logging.StreamHandler):
    """Prints records to the current ``sys.stderr`` while the root logger has no handlers; silent once it has."""

    def __init__(self, level: int = logging.NOTSET):
        logging.Handler.__init__(self, level)  # no stream of its own: sys.stderr is looked up on each record
        self.setFormatter(logging.Formatter(FORMAT))

    @property
    def stream(self):
        return sys.stderr

    def emit(self, record: logging.LogRecord) -> None:
        if not logging.getLogger().handlers:
            super().emit(record)


def install_default_handler() -> None:
    """Give each of :data:`OUR_LOGGERS` a :class:`DefaultHandler` (once) and level INFO (unless one is set), and
    quiet the libraries (:func:`quiet_libraries`)."""
    for name in OUR_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(handler, DefaultHandler) for handler in logger.handlers):
            logger.addHandler(DefaultHandler())
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.INFO)
    quiet_libraries()


def quiet_libraries(level: int = logging.WARNING, force: bool = False) -> None:
    """Set the loggers of :data:`LIBRARY_LOGGERS` to ``level``; without ``force`` only those whose level the
    application left unset."""
    for name in LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        if force or logger.level == logging.NOTSET:
            logger.setLevel(level)


@contextmanager
def no_progress_bars():
    """``datasets``' progress bars (``map``'s "tokenize: ...") off while the block runs, then as they were: a call
    that serves a few questions should print its answers, not bars."""
    from datasets.utils import logging as datasets_logging

    shown = datasets_logging.is_progress_bar_enabled()
    datasets_logging.disable_progress_bar()
    try:
        yield
    finally:
        if shown:
            datasets_logging.enable_progress_bar()
