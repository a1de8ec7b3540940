"""gpubot's pure decision core: domain types, rule files, the expression language, the engines.

Nothing here performs I/O, reads the clock or imports storage/bot; callers pass text and `now` in.
"""
