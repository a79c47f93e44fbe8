# Empty compiler generated dependencies file for headroom.
# This may be replaced when dependencies are built.
