"""Chat cards (Telegram, Discord; Teams draws its own): the text and buttons of a request, the tokens a button carries, and what a click does."""
