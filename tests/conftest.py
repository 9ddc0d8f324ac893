"""Settings for the whole test process, applied before any test module imports grpc."""

import os

# The suite runs gRPC clients and servers in this process and later forks it (PySpark
# launches its JVM with Popen(preexec_fn=...), which forks). gRPC's fork handlers are
# skipped when other threads are inside gRPC at that moment ("skipping fork() handlers")
# and the fork then broke the JVM launch and this process's poller ("epoll_wait error:
# Bad file descriptor"; 17 Spark tests failed once in CI). The forked child only execs
# java, so gRPC needs no fork support here.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

# A new node pre-warms its WAL with 64 MiB of filler (~0.3 s, node/log_store.py); the
# suite starts a few hundred fresh nodes, so it runs them without, except where a test
# turns it on (tests/node/test_wal_prewarm.py).
os.environ.setdefault("STREAMWAL_NODE_WAL_PREWARM", "0")
