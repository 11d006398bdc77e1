"""Put this directory first on PYTHONPATH, with the project root after it, and set
``STRADS_TEST_JITTER=SEED``: every process (the ``replay`` command and each mpiexec rank)
then perturbs its MPI message timing (``tests/jitter.py``)."""

import os

if os.environ.get("STRADS_TEST_JITTER"):
    from tests.jitter import install

    install(int(os.environ["STRADS_TEST_JITTER"]))
