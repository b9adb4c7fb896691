"""Process-wide settings of a worker process (``tuning``: the garbage collector and the C heap;
``memory_trace``: an opt-in report of what the process's memory holds).

Must not import any other worker package.
"""
