"""A python_algos algorithm as a Flower app (python_algos.deploy.flower)."""
