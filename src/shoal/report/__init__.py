"""Tables, figures and reports."""
