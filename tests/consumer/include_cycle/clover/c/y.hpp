// nothing below it
