"""What the broker process runs on, below its services: the event loop, the open-file limit,
who may use its local sockets, the heap's tuning, ZeroMQ sockets read on the loop, the
buffers of a gathered write, plain-int histograms, and its version."""
