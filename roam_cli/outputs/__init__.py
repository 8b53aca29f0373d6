"""What a plan is shown as: the report, the plots, and the exports to other tools' formats."""
