"""The declarations of the objectives and architectures: what params.yaml may say of each and what
checking it takes (bounds, the pairs each makes or takes, widths), with no torch. Every stage imports
them to validate params.yaml; the code that trains, fine-tunes and exports loads each one's
implementation (models/implementations.py)."""
