"""The planners: what a config asks of the cluster, worked out before any actor starts (no Ray here).

``planning.memory_plan`` the peak bytes of every actor on every device; ``planning.placement`` which
actor sits on which GPU; ``planning.time_plan`` how long the run will take.
"""
