"""The corpus build: sources past one process, as Megatron indexed shards (`stagewise data build`).

data/corpus/build.py has the layout and the flow; plan.py the shard plan; steps.py the per-unit
steps; executors.py who runs them (this process or Ray); config.py the recipe's `data.build`.
Nothing is imported here: data/config.py imports config.py, and build.py imports data/config.py.
"""
