"""Sessions: the runtime of each conversation, one module per concept.

``session`` (state, emission, nursery), ``agent`` (the agent loop), ``loop_api``
(the loop's contracts with its session, node and runtime), ``tool_round`` (a
round's tool uses), ``call`` (the LLM call and the translator task), ``turn``
(phases), ``closing`` (how a turn closes: the cancel and crash sequences),
``ending`` (ending a live turn), ``permissions``, ``hub`` (fan-out), ``seam``
(what a subscribe gets), ``sequencer`` (ids), ``recovery`` (turns a crash left
open). Nothing here imports :mod:`gateway.http` or :mod:`gateway.doors`.
"""
