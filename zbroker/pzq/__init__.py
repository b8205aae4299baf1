"""pzq: a persistent store-and-forward queue, wire-compatible with the original pzq.

    wire.py        the frames producers, consumers and monitors exchange (pure)
    zmtp.py        ZeroMQ's wire protocol on the server side of a producer's connection (pure)
    receiver.py    the receive endpoint: a ROUTER for producers on asyncio over zmtp.py
    records.py     the records of the log on disk (pure)
    store.py       the append-only segmented log, written by a writer thread
    group_commit.py  when that writer writes and fdatasyncs (pure, clock passed in)
    dispatcher.py  credit, least-loaded dispatch, ACK timeouts (pure)
    actions.py     what the cores ask of the I/O, and what the log reports back (pure)
    queue.py       one queue's decisions: producers in, deliveries and replies out (no I/O)
    stream.py      stream mode: reads by offset (HEAD, RANGE), COMMIT, the committed offset
                   (no I/O but the offsets file's load and save)
    peering.py     the replication messages between queues, encode/decode (pure)
    replication.py copies on peer queues (static peers or the cluster), and the copies held
                   (no I/O)
    placement.py   which cluster peers hold a queue's copies (pure)
    replica_files.py  the files of replication: node id, replica logs, taken-over keys
    server.py      one queue on its sockets, logs and the asyncio loop
    queue_logs.py  a queue's logs (its own, the copies it holds) and their writers' reports
    consumers.py   the consumers' sockets: send (and its connection events), credit
    monitor.py     the monitor endpoint: MONITOR requests answered with the counters
    stream_endpoint.py  the stream endpoint: readers' requests in, answers out, offsets file
    counters.py    the monitor's counters of a queue, gathered from its parts (pure)
    settings.py    what one queue runs with (resolved settings), and the parts made from them
    sockets.py     a queue's ZeroMQ sockets with their readers, its static peers' DEALERs;
                   non-blocking sends
    service.py     the broker service hosting the configured queues
    client.py      Python producer, consumer and stream consumer
    shell.py       ``zbroker queue put|get``
    cli.py         the standalone ``pzq`` command
"""
