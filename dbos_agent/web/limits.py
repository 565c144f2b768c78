"""What one server lets its clients hold, and for how long: the defaults of ``dbos-agent
serve``'s options and of :func:`~dbos_agent.web.create_app`'s (no third-party import, so
the CLI can show them without the ``web`` extra).

A local web server is reachable from every page the user's browser opens and from every
local user, so nothing a client does may make it hold more than these: a stream answer
holds one page of items and a slice of one being sent; a connection that sends its
request slowly, or takes none of its answer, is closed.
"""

from __future__ import annotations

#: Streams (Server-Sent Events answers) open at once, all clients together; one more is
#: answered 503 ``TooManyStreams``. A browser opens at most 6 connections to a server.
DEFAULT_MAX_STREAMS = 32

#: The most JSON text of the items a stream answer holds at once (one page, read only
#: when the client has taken the last; one item larger than this is held alone).
DEFAULT_STREAM_PAGE_BYTES = 256 * 1024

#: The size of each write of a stream answer (an item's text is sent in slices).
STREAM_SLICE_CHARS = 16 * 1024

#: Connections open at once; one more is answered 503 ``TooManyConnections`` and closed.
DEFAULT_MAX_CONNECTIONS = 1000

#: Seconds a client has to send a whole request (line, headers and body) once its
#: connection is open or its last answer was sent; then 408 and the connection closed.
DEFAULT_REQUEST_TIMEOUT = 10.0

#: Seconds an idle keep-alive connection stays open between requests.
DEFAULT_IDLE_TIMEOUT = 5

#: Seconds a client may take none of an answer it is being sent before its connection is
#: dropped (a reader that has stopped reading a stream, or never read it).
DEFAULT_SEND_TIMEOUT = 60.0

#: The most bytes of a request's line and headers (h11 refuses more with 400).
MAX_HEAD_BYTES = 16 * 1024
