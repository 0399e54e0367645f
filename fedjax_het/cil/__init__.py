"""Federated class-incremental learning (GLFC, CVPR 2022): the pieces its round is built from.

Submodules are imported explicitly (`from fedjax_het.cil import exemplars`);
this package imports none of them, so each stays cheap to load.
"""
