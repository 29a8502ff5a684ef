"""The chapters' exercise graders (`check_*`), kept apart from the model code.

`transformer_lib.exercises.<module>` holds the graders of the chapter that builds `transformer_lib.<module>`, and
`grading` the toolkit they are written with. These modules are hand-written, not exported from the chapters: a
grader's reference and named slips would give the answers away, and Colab shows every cell of a chapter. The
chapters import them in their exercises sections."""
