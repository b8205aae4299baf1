"""The broker's side of the cluster: its node started with the cluster's key, the seeds of a
join token and the members it remembers; peers joining and leaving, and their messages,
relayed to the services; the snapshot of the cluster it keeps across restarts; the join file;
and the node started anew when the cluster key changes."""

from __future__ import annotations

import asyncio
from typing import Any

import zmq

from zbroker import logs
from zbroker.config import Config
from zbroker.management import CommandError

from .hosted import HostedServices
from .startup import StartupError

RELINK_BIND_WAIT = 5.0  # seconds a new cluster node waits for the peer socket's port


class Clustering:
    """The cluster node of broker ``name`` (when ``config.cluster.enabled``) and what goes
    with it; ``seeds`` are a join token's (said HELLO to as cluster.peers are), ``hosted``
    the services it relays to, ``log`` the broker's."""

    def __init__(self, config: Config, name: str, seeds: tuple[str, ...],
                 hosted: HostedServices, log: Any) -> None:
        self.config = config  # the running config (a reload's: ``configure``)
        self.name = name
        self.seeds = tuple(seeds)
        self.hosted = hosted
        self.log = log
        self.node: Any = None  # the cluster node, while it runs
        #: what the cluster runs with: (key pair or None, key file, made), once it started
        self.keys: Any = None
        self._memory: Any = None  # the cluster's snapshot, kept (cluster/snapshot.py)
        self._relinking: asyncio.Task[None] | None = None  # the node started anew
        self._zmq_context: zmq.Context[Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def start(self, zmq_context: zmq.Context[Any], loop: asyncio.AbstractEventLoop) -> None:
        """Start the node (after the services: it tells peers their features). Raises
        StartupError if it cannot."""
        from zbroker.cluster.node import ClusterError
        from zbroker.cluster.security import KeyFileError, cluster_keys

        self._zmq_context, self._loop = zmq_context, loop
        try:
            keys = cluster_keys(self.config.cluster)
        except KeyFileError as exc:
            raise StartupError(str(exc)) from None
        if keys[0] is not None:
            self._remember_cluster()
        node = self._cluster_node()
        try:
            await node.start(keys)
        except ClusterError as exc:
            raise StartupError(str(exc)) from None
        self.node, self.keys = node, keys
        for port in self.hosted.ports:
            port.node = node
        if keys[0] is not None:
            self.write_join_file(announce=True)
            self._memory.start()

    async def stop(self, timeout: float) -> None:
        """Stop the node (within ``timeout`` seconds, or it is logged) and what goes with it.
        Safe to call twice."""
        relinking, self._relinking = self._relinking, None
        if relinking is not None and not relinking.done():
            relinking.cancel()
            await asyncio.gather(relinking, return_exceptions=True)
        memory, self._memory = self._memory, None
        if memory is not None:  # (the peers of now noted: the cluster is still there)
            memory.stop()
        node, self.node = self.node, None
        if node is not None:
            for port in self.hosted.ports:
                port.node = None
            try:
                await asyncio.wait_for(node.stop(), timeout)
            except Exception:
                self.log.exception("cluster failed to stop")

    def _cluster_node(self) -> Any:
        """A cluster node for the running config and services (not started)."""
        from zbroker.cluster.node import ClusterNode, message_limit

        assert self._zmq_context is not None and self._loop is not None  # (start gave them)
        return ClusterNode(
            self.config.cluster, self.name, self._zmq_context, self._loop,
            logs.get_logger(component="cluster"),
            on_join=self._peer_joined,
            on_leave=lambda peer, why, alive: self.hosted.peer_left(peer, alive),
            on_message=self.hosted.message_relay(),
            max_message=message_limit(self.hosted.largest_payload(self.config)),
            features=self.hosted.features(),
            seeds=(*self.seeds, *self._remembered()))

    def _peer_joined(self, peer: Any) -> None:
        self.hosted.peer_joined(peer)
        if self._memory is not None:
            self._memory.joined(peer.endpoint)

    # --- what it remembers -------------------------------------------------------------------

    def _remembered(self) -> list[str]:
        """The members this broker knew before its restart (cluster/snapshot.py)."""
        memory = self._memory
        return memory.snapshot.endpoints() if memory is not None else []

    def _remember_cluster(self) -> None:
        """Keep what this broker knows of its keyed cluster across restarts (its name, key
        file, seeds and members): the snapshot of before, if it is of this cluster."""
        from zbroker.cluster import snapshot

        cfg = self.config.cluster
        path = snapshot.snapshot_path(self.name)
        try:
            known = snapshot.load(path)
        except ValueError as exc:
            self.log.warning("cluster snapshot ignored", reason=str(exc))
            known = None
        key_file = str(cfg.key_file) if cfg.key_file is not None else None
        if known is None or known.cluster != cfg.name:
            known = snapshot.Snapshot(cfg.name, key_file, self.seeds)
        known.key_file = key_file
        if self.seeds:  # a join token's, now
            known.seeds = self.seeds
        self._memory = snapshot.Memory(
            self._loop, path, known, self.log,
            peers=lambda: [p["endpoint"] for p in self.node.peers()] if self.node
            else [], saved=self._rewrite_join_file)

    def _rewrite_join_file(self) -> None:
        if self.node is not None and self.node.keys() is not None:
            self.write_join_file()

    # --- a reload ----------------------------------------------------------------------------

    def configure(self, config: Config) -> None:
        """A reload applied ``config``: a pipe's chunk or a queue's message may be larger
        now, and a node started anew starts with it."""
        self.config = config
        if self.node is not None:
            from zbroker.cluster.node import message_limit

            self.node.set_max_message(message_limit(self.hosted.largest_payload(config)))

    def keys_for(self, config: Config) -> tuple[Any, Any]:
        """What ``config`` makes of the running cluster's key (call it when it runs with
        one): (the new key, or None when it is the same; the same key from another file, or
        None). Raises KeyFileError when the key cannot be read."""
        from zbroker.cluster.security import cluster_keys

        keys = cluster_keys(config.cluster)
        if keys[0] != self.keys[0]:
            return keys, None
        if keys[1] != self.keys[1]:
            return None, keys
        return None, None

    def key_moved(self, keys: Any) -> None:
        """The same key, from another file now."""
        if self.node is not None:
            self.keys = keys
            self.node.key_file = str(keys[1])

    def relink(self, keys: Any) -> None:
        """Start the cluster node anew with ``keys`` (a new cluster key), after the one
        that runs, or will once a relink under way is done."""
        assert self._loop is not None
        self.keys = keys
        before = self._relinking
        self._relinking = self._loop.create_task(self._relink(keys, before))

    async def _relink(self, keys: Any, before: asyncio.Task[None] | None) -> None:
        """The node of before says BYE to its peers ("the cluster key changed") and goes,
        every peer's life ends; a new node binds the same peer socket with the new key and
        says HELLO to the seeds, to zeroconf's brokers and to the peers of before: those that
        have the same key link again."""
        from zbroker.cluster.node import ClusterError

        if before is not None:
            await asyncio.gather(before, return_exceptions=True)
        old = self.node
        contacts = [peer["endpoint"] for peer in old.peers()] if old is not None else []
        self.log.info("cluster key changed: linking the peers anew",
                      key_file=str(keys[1]) if keys[1] else None, peers=len(contacts))
        node = self._cluster_node()
        if old is not None:
            self.node = None
            for port in self.hosted.ports:
                port.node = None
            await old.stop(why="the cluster key changed")
            node.carry_counters(old)
        try:
            await node.start(keys, bind_wait=RELINK_BIND_WAIT)
        except ClusterError as exc:
            self.log.error("cluster stopped: the new key could not be applied", reason=str(exc))
            await node.stop()
            return
        except asyncio.CancelledError:
            await node.stop()
            raise
        for endpoint in contacts:
            node.add_contact(endpoint, pinned=False)
        self.node = node
        for port in self.hosted.ports:
            port.node = node
        if keys[0] is not None:
            self.write_join_file()

    # --- what it says ------------------------------------------------------------------------

    def write_join_file(self, announce: bool = False) -> dict[str, Any]:
        """Write the cluster's join file (a join token: our key and our endpoint as the seed,
        mode 0600, beside the key file; see cluster/joining.py) and, with ``announce``, say
        what to run on another host (on standard output and in the log). Returns what
        ``zbroker join-token`` shows (the token even when the file cannot be written: that is
        logged and said); CommandError when there is nothing to join (no cluster, no key)."""
        from zbroker.cluster import joining
        from zbroker.cluster.join_token import JoinToken, encode

        node = self.node
        if node is None or node.keys() is None:
            raise CommandError("this broker has no cluster with a key to join: start it with "
                               "--cluster (and without cluster.insecure)")
        public, secret = node.keys()
        seed, loopback = joining.seed_endpoint(node.advertised, node.endpoint)
        # and the peers that answered: a join file copied back over the one it came from
        # still names a member other than ourselves; a seed that never answered is not passed
        # on (a dead seed of this host's config was copied into its join file)
        seeds = joining.usable_seeds((seed, *(p["endpoint"] for p in node.peers())))
        token = JoinToken(self.config.cluster.name, seeds, public, secret)
        path = joining.join_file_path(node.key_file)
        try:
            joining.write_private(path, joining.join_file_text(token))
            text = joining.instructions(path, self.name)
            written = True
        except OSError as exc:
            self.log.warning("cannot write the cluster's join file: `zbroker join-token "
                             "--token` prints the token", file=str(path),
                             reason=exc.strerror or str(exc))
            text = (f"To add a host to this cluster, run there: zbroker {self.name} --join - "
                    f"with the output of `zbroker join-token --token` here as its input "
                    f"(the join file {path} cannot be written: {exc.strerror or exc})")
            written = False
        if loopback:
            text += ("\n(the seed in it, " + seed + ", is a loopback address that no other "
                     "host reaches: name this host's address with --advertise ADDRESS)")
        if announce:
            try:
                print(text, flush=True)
            except OSError:  # no standard output to speak of: the log says it
                pass
            if written:
                self.log.info("cluster join file written", file=str(path), seeds=list(seeds),
                              run_on_another_host=f"zbroker {self.name} --join-file "
                                                  f"{path.name}")
        return {"file": str(path) if written else None, "cluster": token.cluster,
                "seeds": list(seeds), "token": encode(token), "instructions": text}

    def status(self) -> dict[str, Any] | None:
        """The cluster's part of ``zbroker status`` (None without a node)."""
        node = self.node
        if node is None:
            return None
        return {"endpoint": node.endpoint, "peers": node.peers(),
                "pending_contacts": node.pending_contacts(), **node.security(),
                **node.diagnosis()}

    def metrics(self) -> Any:
        """The cluster's part of the metrics snapshot (None without a node)."""
        return self.node.metrics() if self.node is not None else None
