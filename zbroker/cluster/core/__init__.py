"""The cluster's core, without I/O: what a broker does with its peers' messages (HELLO, PING,
BYE, MEMBERS, SVC), its heartbeats, what it holds for a peer whose link is made again, and why
hosts do not link. It is given events (a message with its frames, the time, what a link did,
what the broker asks) and returns what to do as typed actions (actions.py); it never touches a
socket, a clock or the logger. The libzmq layer (cluster/node.py) owns the sockets and carries
the actions out. Held to it by tests/processes/test_cluster_core_imports.py and mypy --strict.
"""
