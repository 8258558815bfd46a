"""The student's own engine: ``kestrel-lab student init | check | notebooks``.

- ``workspace`` — ``student init``: the student's package (``mykestrel/``), one module per capability and
  one skeleton per piece of ``kestrel_lab.seam``; running it again only adds what is missing.
- ``checks``    — ``student check``: each written piece run where it matters (its seam) and compared with
  the package, a wrong one located (byte offset, tensor, layer and position, token id).
- ``notebooks`` — ``student notebooks``: the lessons without their reference solutions and answers.
- ``cli``       — the three commands.
- ``capstone``  — day30_1's engine: the workspace's pieces, the reference answers for the rest, counted.

Taught in day30_1.
"""
