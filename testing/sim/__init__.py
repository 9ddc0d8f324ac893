"""A deterministic in-process simulator of a streamwal cluster (see cluster.py).

python -m streamwal.testing.sim --seeds 10000     # a soak
python -m streamwal.testing.sim --seed 1234 -v    # replay one seed, with its log
"""
