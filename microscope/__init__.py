"""microscope: measure what one change did to accuracy, speed, memory, stability and generalization."""

__version__ = "0.1.0"
