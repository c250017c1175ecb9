"""The conversation dispatcher: what a gateway does with the turns of a busy conversation.

:class:`Dispatcher` (asyncio tasks) and :class:`ThreadDispatcher` (a thread pool) take the
turns of many conversations (keys), run each key's turns one at a time in submit order
under the lanes of a queue, and apply a busy policy when a key already has work:

=============  ==============================================================================
``enqueue``    join the end of the key's line (default)
``reject``     end at once as ``rejected`` ("busy")
``steer``      hand the payload to the current turn's ``inbox`` (same ``fn``, nothing
               pending); if it never takes it, it runs as a normal turn next
``interrupt``  cancel the running turn; drop the turns not started ("superseded"), the
               current one too if its ``fn`` has not been called yet; run this next
``replace``    the running turn goes on; drop the pending ones ("superseded"); this waits
``collect``    merge the key's pending turns of the same ``fn`` into one call with the list
               of their payloads (``debounce_s``, ``max_wait_s``)
=============  ==============================================================================

Both share one state machine (:mod:`lanequeue.dispatch._machine`); its module docstring
describes the ticket states, the transitions, the locking and the exact reach of priority.
"""

from ._asyncio import Dispatcher
from ._machine import (
    BUSY_POLICIES,
    OVERFLOW_POLICIES,
    DispatchStats,
    Inbox,
    Ticket,
    Turn,
    current_turn,
)
from ._threads import ThreadDispatcher

__all__ = [
    "BUSY_POLICIES",
    "DispatchStats",
    "Dispatcher",
    "Inbox",
    "OVERFLOW_POLICIES",
    "ThreadDispatcher",
    "Ticket",
    "Turn",
    "current_turn",
]
