"""The controller as a gRPC service, and the worker processes that call it.

``server`` serves a ``ControllerLoop`` (``Describe``, ``Join``, long-poll ``Poll``, ``Submit``,
``Heartbeat``, ``Leave``); ``client`` is the worker's end, with retries and fail-over between
controller addresses; ``wire`` turns work items and events into messages and checks what a
worker submits; ``worker`` is ``rlx worker ROLE``; ``supervisor`` starts, watches and restarts
the worker processes of ``rlx run``.
"""
