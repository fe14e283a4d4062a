"""The pieces of pb_utils (`triton_python_backend_utils`); utils.py is its public face."""
