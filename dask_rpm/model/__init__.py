"""A trained network (``MLPModel``) and its model file."""
