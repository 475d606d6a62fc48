"""The benchmark's WSGI app: requests that mix CPU work (fib) and waiting (sleep)."""
