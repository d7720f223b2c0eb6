"""Plans: the rectangles of one iteration (``Plan``), their real-valued layout and their dataset form.

Pure (numpy only): the planners build these records, the engine and the results read them.
"""
