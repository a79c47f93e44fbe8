# Empty compiler generated dependencies file for hr_common.
# This may be replaced when dependencies are built.
