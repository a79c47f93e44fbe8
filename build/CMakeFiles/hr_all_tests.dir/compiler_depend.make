# Empty custom commands generated dependencies file for hr_all_tests.
# This may be replaced when dependencies are built.
