"""Arrow-backed checkpoints: the State codec, the immutable snapshot store on ``pyarrow.fs``, group commit.

Plain Python, no Ray. Internal.
"""
