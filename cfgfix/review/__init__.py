"""`cfgfix review`: findings on a pull request's changed lines.

    git diff (changed files and lines)  ->  lint changed + linked files (engine)
    ->  keep findings that touch a changed line (or whose related span does)
    ->  placed comments with suggestions  ->  github-review / rdjson / text / json
    ->  optionally posted through the GitHub REST API (`post.py`)

The review only reads files and runs git; it never runs code from the pull request.
"""
