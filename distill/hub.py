"""Whether the Hugging Face hub can be reached, found out in milliseconds instead of after the clients' retries.

``datasets.load_dataset`` retries an unreachable hub with back-off for about 25-30 s and then raises a
``ConnectionError`` under some 40 lines of traceback. One HEAD request to the hub's address with a short timeout,
through ``huggingface_hub``'s own HTTP session (its proxies and ``HF_ENDPOINT``), tells the same at once.
"""

from __future__ import annotations

PROBE_TIMEOUT_S = 5.0


def offline_mode() -> bool:
    """Whether ``HF_HUB_OFFLINE`` is set (the clients then read their caches only and fail fast by themselves)."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def hub_unreachable(timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """Why the hub cannot be reached (the connection error in one line), or None when it answers at all.

    Any HTTP answer counts as reachable: a dataset missing there is the loader's error to report, not this one.
    """
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session

    try:
        get_session().head(constants.ENDPOINT, timeout=timeout_s)
    except Exception as error:  # the HTTP client's connect / timeout / proxy errors, whichever client it is
        return f"{constants.ENDPOINT}: {' '.join(str(error).split()) or type(error).__name__}"
    return None
