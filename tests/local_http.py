"""A real HTTP server on 127.0.0.1 with a test's own request handler, served from a thread and stopped on
exit: the servers of the tests that need a server to behave in one exact way (never answer, drop a
kept-alive connection), which vLLM's cannot be made to on demand."""

import contextlib
import threading
from http.server import ThreadingHTTPServer


@contextlib.contextmanager
def local_http_server(handler):
    """Its base URL (http://127.0.0.1:PORT) while the block runs."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
