"""The chapters' exercise graders (`check_*`), kept apart from the model code.

`transformer_lib.exercises.<module>` holds the checks of the chapter that builds `transformer_lib.<module>`;
each is exported from that chapter's `#| export exercises.<module>` cells."""
