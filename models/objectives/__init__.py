"""The objectives' implementations, one module each: what each computes (its pair, its head),
loaded where training runs (models/implementations.py) by the module its declaration names
(models/specs/objectives)."""
