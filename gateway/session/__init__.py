"""Sessions: the runtime of each conversation, one module per concept.

``session`` (state, emission, nursery), ``agent`` (the agent loop), ``call`` (the
LLM call and the translator task), ``turn`` (phases), ``cancel`` (the cancel
sequences), ``permissions``, ``hub`` (fan-out), ``seam`` (what a subscribe
gets), ``sequencer`` (ids), ``recovery`` (turns a crash left open). Nothing
here imports :mod:`gateway.server`.
"""
