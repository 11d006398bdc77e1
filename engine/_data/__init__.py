"""The distributed data structures: DDS, their initialisers, pre-training operators."""
