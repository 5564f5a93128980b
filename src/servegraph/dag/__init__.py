"""The DAG, standard library only: the model (`model`) and the runtime's args codec (`args`).

Shared by the graph validator, the renderers and the runtime inside Ray; it
imports nothing of servegraph's dependencies so that the runtime can load it.
"""
