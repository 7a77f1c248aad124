"""Writing what a run leaves in OUT: grades, feedback, returns, gradebooks, the hand-graded parts, similarity."""
