"""Process-wide settings of a worker process (``tuning``: the garbage collector and the C heap).

Must not import any other worker package.
"""
