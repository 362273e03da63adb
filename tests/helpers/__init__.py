"""What many test folders share, imported by name (``from helpers.images import class_tree``), never from
another folder's conftest: image trees (:mod:`helpers.images`), tiny checkpoints (:mod:`helpers.checkpoints`),
page screenshots (:mod:`helpers.pages`), a ``rankopt serve`` process (:mod:`helpers.servers`)."""
