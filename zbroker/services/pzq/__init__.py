"""pzq: a persistent store-and-forward queue, wire-compatible with the original pzq.

    core/          every decision of a queue, without I/O: the wire (producers, consumers,
                   monitors), the log's records, group commit, the dispatcher, the queue,
                   stream mode, the idempotence window, replication and placement, the
                   actions the cores return, the monitor's counters
    receiver.py    the receive endpoint: a ROUTER for producers on the broker's ZMTP server
    endpoints.py   the send, credit, monitor and stream endpoints on the same server
    store.py       the append-only segmented log, written by a writer thread
    offsets_file.py  a stream queue's offsets file, replaced durably
    replica_files.py  the files of replication: node id, replica logs, taken-over keys
    server.py      one queue on its sockets, logs and the asyncio loop: carries out what the
                   cores ask
    queue_logs.py  a queue's logs (its own, the copies it holds) and their writers' reports
    consumers.py   the consumers' endpoints: send (and its connection events), credit
    monitor.py     the monitor endpoint: MONITOR requests answered with the counters
    stream_endpoint.py  the stream endpoint: readers' requests in, answers out, offsets file
    config.py      the service's config section, ``services.pzq``
    metrics.py     the service's metric families
    settings.py    what one queue runs with (resolved settings), and the parts made from them
    sockets.py     a queue's ZeroMQ sockets with their readers, its static peers' DEALERs;
                   non-blocking sends
    service.py     the broker service hosting the configured queues
    commands/      its programs, apart from what runs in a broker: the standalone ``pzq``
                   command and ``zbroker queue put|get|group`` (which service.py hands to the
                   broker's CLI); they import the service's modules, not the other way round
    (the Python client is the package ``pzq``, beside ``zpipes``)
"""
